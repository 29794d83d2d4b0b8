"""The data layer's settings (TICKETFLOW_FEATURES_*): a group of the one settings model.

They live in streams/settings.py with every other setting (docs/settings.md lists them); this
module keeps the name the data layer has always imported.
"""

from streams.settings import FeatureSettings

__all__ = ["FeatureSettings"]
