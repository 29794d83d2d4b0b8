"""The feature views this deployment serves."""

from __future__ import annotations

from schemas.features import Feature, FeatureView

HOUR = 3600
DAY = 24 * HOUR

USER_TICKET_STATS = FeatureView(
    name="user_ticket_stats",
    entity="user_id",
    source_topic="tickets.in",
    ttl_seconds=300,
    features=[
        Feature(name="tickets_1h", type="int", default=0, aggregation="count", window_seconds=HOUR),
        Feature(
            name="tickets_7d", type="int", default=0, aggregation="count", window_seconds=7 * DAY
        ),
        Feature(
            name="refund_mentions_30d",
            type="int",
            default=0,
            aggregation="count_matching",
            window_seconds=30 * DAY,
            field="text",
        ),
        Feature(
            name="mean_text_len_7d",
            type="float",
            default=0.0,
            aggregation="mean",
            window_seconds=7 * DAY,
            field="text",
        ),
        Feature(
            name="channels", type="list[str]", default=[], aggregation="distinct", field="channel"
        ),
        Feature(
            name="last_ticket_at",
            type="timestamp",
            default=None,
            aggregation="last",
            field="created_at",
        ),
    ],
)

VIEWS: dict[str, FeatureView] = {USER_TICKET_STATS.name: USER_TICKET_STATS}
