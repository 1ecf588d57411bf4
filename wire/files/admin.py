from django.contrib import admin

from wire.files.models import StoredFile


@admin.register(StoredFile)
class StoredFileAdmin(admin.ModelAdmin):
    list_display = ("id", "filename", "purpose", "bytes", "namespace", "created")
    list_filter = ("purpose",)
    search_fields = ("id", "filename", "namespace")
    readonly_fields = [f.name for f in StoredFile._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False
