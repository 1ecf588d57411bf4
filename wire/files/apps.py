from django.apps import AppConfig


class FilesApiConfig(AppConfig):
    """OpenAI Files API (/v1/files): uploads streamed to disk under PANTHEON_FILES_DIR,
    recorded in the database, owned by the uploading key; batch outputs live here too."""

    name = "wire.files"
    label = "files_api"
    default_auto_field = "django.db.models.BigAutoField"
