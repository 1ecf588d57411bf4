"""Ollama's routes (/api/...): exact paths, as every route here."""

from django.urls import path

from wire.ollama import views

urlpatterns = [
    path("api/chat", views.chat, name="ollama-chat"),
    path("api/generate", views.generate, name="ollama-generate"),
    path("api/embed", views.embed, name="ollama-embed"),
    path("api/embeddings", views.embeddings, name="ollama-embeddings"),
    path("api/tags", views.tags, name="ollama-tags"),
    path("api/ps", views.ps, name="ollama-ps"),
    path("api/show", views.show, name="ollama-show"),
    path("api/version", views.version, name="ollama-version"),
    *(
        path(f"api/{action}", views.managed, {"action": action}, name=f"ollama-{action}")
        for action in views.MANAGED
    ),
]
