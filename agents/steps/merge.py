"""One prediction from several: what a `parallel` step's `merge` does with its branches'."""

from __future__ import annotations

from collections.abc import Sequence

from schemas.tickets import Category, Prediction


def merge_predictions(predictions: Sequence[Prediction], how: str = "mean") -> Prediction:
    """`mean`: the mean of the score vectors, then argmax, model_version "v1+v2";
    `max_confidence`: the most confident prediction as it is."""
    if not predictions:
        raise ValueError("no prediction to merge")
    if len(predictions) == 1:
        return predictions[0]
    if how == "max_confidence":
        return max(predictions, key=lambda p: p.confidence)
    vectors = [p.scores or {p.category.value: p.confidence} for p in predictions]
    labels = list(dict.fromkeys(label for v in vectors for label in v))
    mean = {label: sum(v.get(label, 0.0) for v in vectors) / len(vectors) for label in labels}
    # argmax; a tie goes to the label the first prediction listed first (stable order)
    best = max(labels, key=lambda label: mean[label])
    return Prediction(
        category=Category(best),
        confidence=min(1.0, mean[best]),
        scores=mean,
        model_name=predictions[0].model_name,
        model_version="+".join(dict.fromkeys(p.model_version for p in predictions)),
    )
