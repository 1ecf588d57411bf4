from django.urls import path

from wire.batches import views

# Exact paths, no trailing-slash variants: anything else is the JSON 404.
urlpatterns = [
    path("v1/batches", views.batches, name="batches"),
    path("v1/batches/<str:batch_id>", views.batch_detail, name="batch"),
    path("v1/batches/<str:batch_id>/cancel", views.cancel_batch, name="batch-cancel"),
]
