"""The router's URL table (PANTHEON_ROLE=router; pantheon_site/urls.py takes it instead of
the serve routes). The forwarded client routes are not here: cluster/dispatch.py is an
ASGI app in front of Django (cluster/asgi.py)."""

from django.urls import path

from cluster import console, views

urlpatterns = [
    path("", views.HealthView.as_view(), name="router-health"),
    path("health", views.LlamaHealthView.as_view(), name="router-llama-health"),
    path("v1/models", views.ModelsView.as_view(), name="router-models"),
    path("models", views.ModelsView.as_view(), name="router-models-no-v1"),
    path("v1/models/<path:model_id>", views.ModelView.as_view(), name="router-model"),
    path("models/<path:model_id>", views.ModelView.as_view(), name="router-model-no-v1"),
    path("registry/register", views.RegisterView.as_view(), name="registry-register"),
    path("registry/heartbeat", views.HeartbeatView.as_view(), name="registry-heartbeat"),
    path("registry/deregister", views.DeregisterView.as_view(), name="registry-deregister"),
    path("admin/instances", views.InstancesView.as_view(), name="admin-instances"),
    path(
        "admin/instances/<str:instance_id>/drain",
        views.DrainView.as_view(),
        name="admin-instance-drain",
    ),
    # Before the console's own routes (pantheon_site/urls.py): its login guards it.
    path("console/instances/", console.page, name="console-instances"),
]
