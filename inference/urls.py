from django.urls import path

from inference import views

# Exact paths, no trailing-slash variants: anything else is the JSON 404.
urlpatterns = [
    path("", views.HealthView.as_view(), name="health"),
    path("v1/models", views.ModelsView.as_view(), name="models"),
    path("v1/chat/completions", views.chat_completions, name="chat-completions"),
    # Operator test hook; answers the JSON 404 unless PANTHEON_DEBUG_ROUTES is on.
    path(
        "admin/debug/simulate-memory-pressure",
        views.simulate_memory_pressure,
        name="simulate-memory-pressure",
    ),
]
