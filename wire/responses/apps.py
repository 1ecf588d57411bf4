from django.apps import AppConfig


class ResponsesApiConfig(AppConfig):
    """OpenAI Responses API (/v1/responses): a thin wire-format adapter on the chat core,
    and the stored responses that `previous_response_id` continues."""

    name = "wire.responses"
    label = "responses_api"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from observability.views import add_section
        from wire.responses import storage

        add_section("stored_responses", storage.stats)
