"""Ingest's settings (TICKETFLOW_INGEST_*): a group of the one settings model.

They live in streams/settings.py with every other setting (docs/settings.md lists them); this
module keeps the names ingest has always imported.
"""

from streams.settings import MAX_BATCH, IngestSettings

__all__ = ["MAX_BATCH", "IngestSettings"]
