from django.urls import path

from wire.responses import input_items, views

# Exact paths, no trailing-slash variants: anything else is the JSON 404.
urlpatterns = [
    path("v1/responses", views.create_response, name="responses"),
    path("v1/responses/<str:response_id>", views.response_detail, name="response"),
    path(
        "v1/responses/<str:response_id>/input_items",
        input_items.input_items,
        name="response-input-items",
    ),
]
