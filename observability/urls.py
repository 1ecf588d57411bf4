from django.urls import path

from observability import views

# Exact paths, no trailing-slash variants: anything else is the JSON 404.
urlpatterns = [
    path("metrics", views.metrics_view, name="metrics"),
    path("admin/stats", views.StatsView.as_view(), name="admin-stats"),
]
