from django.urls import include, path

from wire.anthropic import views as anthropic_views
from wire.completions import embeddings, tokenize
from wire.completions import views as completion_views
from wire.llamacpp import views as llamacpp_views
from wire.meta import views as meta_views
from wire.openai_chat import views

# Exact paths, no trailing-slash variants: anything else is the JSON 404. Some clients
# leave /v1 out of their base URL: /chat/completions and /models are the same routes.
urlpatterns = [
    path("", meta_views.HealthView.as_view(), name="health"),
    path("health", meta_views.LlamaHealthView.as_view(), name="llama-health"),
    path("v1/models", meta_views.ModelsView.as_view(), name="models"),
    path("models", meta_views.ModelsView.as_view(), name="models-no-v1"),
    # <path:>: a served name may contain "/" (org/model names are common).
    path("v1/models/<path:model_id>", meta_views.ModelView.as_view(), name="model"),
    path("models/<path:model_id>", meta_views.ModelView.as_view(), name="model-no-v1"),
    path("v1/chat/completions", views.chat_completions, name="chat-completions"),
    path("chat/completions", views.chat_completions, name="chat-completions-no-v1"),
    path("v1/messages", anthropic_views.messages, name="anthropic-messages"),
    path("v1/messages/count_tokens", anthropic_views.count_tokens, name="anthropic-count-tokens"),
    path("v1/completions", completion_views.completions, name="completions"),
    path("v1/embeddings", embeddings.embeddings, name="embeddings"),
    path("tokenize", tokenize.tokenize, name="tokenize"),  # llama.cpp's
    path("detokenize", tokenize.detokenize, name="detokenize"),
    # llama-server's own routes (llama.cpp's tools and editor plugins)
    path("props", llamacpp_views.props, name="llama-props"),
    path("slots", llamacpp_views.slots, name="llama-slots"),
    path("completion", llamacpp_views.completion, name="llama-completion"),
    path("infill", llamacpp_views.infill, name="llama-infill"),
    path("", include("wire.responses.urls")),  # /v1/responses, /v1/responses/{id}
    path("", include("wire.files.urls")),  # /v1/files, /v1/files/{id}[/content]
    path("", include("wire.batches.urls")),  # /v1/batches, /v1/batches/{id}[/cancel]
    path("", include("wire.ollama.urls")),  # Ollama's API: /api/chat, /api/tags, ...
    # Operator test hook; answers the JSON 404 unless PANTHEON_DEBUG_ROUTES is on.
    path(
        "admin/debug/simulate-memory-pressure",
        meta_views.simulate_memory_pressure,
        name="simulate-memory-pressure",
    ),
]
