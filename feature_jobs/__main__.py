"""`python -m feature_jobs [run|describe|drift]`: the data layer's commands without the CLI."""

from feature_jobs.cli import features_app

features_app(prog_name="feature_jobs")
