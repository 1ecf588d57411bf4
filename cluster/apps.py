from django.apps import AppConfig


class ClusterConfig(AppConfig):
    name = "cluster"
    label = "cluster"
    verbose_name = "Cluster (router)"
