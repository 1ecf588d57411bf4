from django.urls import path

from wire.files import views

# Exact paths, no trailing-slash variants: anything else is the JSON 404.
urlpatterns = [
    path("v1/files", views.files, name="files"),
    path("v1/files/<str:file_id>", views.file_detail, name="file"),
    path("v1/files/<str:file_id>/content", views.file_content, name="file-content"),
]
