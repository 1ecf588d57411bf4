from django.urls import path

from inference import views

# Exact paths, no trailing-slash variants: anything else is the JSON 404.
urlpatterns = [
    path("", views.HealthView.as_view(), name="health"),
    path("v1/models", views.ModelsView.as_view(), name="models"),
    path("v1/chat/completions", views.chat_completions, name="chat-completions"),
]
