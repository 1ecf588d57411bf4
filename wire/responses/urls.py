from django.urls import path

from wire.responses import views

# Exact paths, no trailing-slash variants: anything else is the JSON 404.
urlpatterns = [
    path("v1/responses", views.create_response, name="responses"),
    path("v1/responses/<str:response_id>", views.response_detail, name="response"),
]
