from django.apps import AppConfig


class BaselineConfig(AppConfig):
    name = "bench.baseline"
    label = "bench_baseline"
    verbose_name = "Benchmark baselines"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from bench.mechanisms import switch_off_for_process

        switch_off_for_process()
