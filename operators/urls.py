from django.urls import path

from operators import views

# Exact paths, no trailing-slash variants: anything else is the JSON 404.
urlpatterns = [
    path("admin/models", views.AdminModelsView.as_view(), name="admin-models"),
    path("admin/models/load", views.LoadView.as_view(), name="admin-load"),
    path("admin/models/unload", views.UnloadView.as_view(), name="admin-unload"),
    path("admin/models/pin", views.PinView.as_view(), name="admin-pin"),
    path("admin/models/available", views.AvailableView.as_view(), name="admin-available"),
    path("admin/dies", views.DiesView.as_view(), name="admin-dies"),
    path("admin/aliases", views.AliasesView.as_view(), name="admin-aliases"),
    path("admin/config", views.ConfigView.as_view(), name="admin-config"),
    path("admin/shutdown", views.ShutdownView.as_view(), name="admin-shutdown"),
    # <path:>: an alias may contain "/" (org/model names are common).
    path("admin/aliases/<path:alias>", views.AliasView.as_view(), name="admin-alias"),
]
