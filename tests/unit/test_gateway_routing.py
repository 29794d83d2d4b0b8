"""Version routing: canary weights, stickiness per id, explicit versions, config updates."""

from __future__ import annotations

import pytest

from inference_gateway.errors import ErrorCode, GatewayError
from inference_gateway.routing import (
    DEFAULT_CONFIG,
    Router,
    bucket_of,
    pick_version,
    triton_version,
)
from schemas.routing import RoutingConfig

MODEL = "ticket_classifier"
IDS = [f"ticket-{i}" for i in range(10_000)]


def config(**weights: int) -> RoutingConfig:
    return RoutingConfig(name=MODEL, versions=weights, default="v1")


def test_the_default_config_sends_everything_to_v1() -> None:
    router = Router()
    assert router.config(MODEL) == DEFAULT_CONFIG
    assert {router.choose(MODEL, i) for i in IDS[:500]} == {"v1"}


@pytest.mark.parametrize("canary", [1, 10, 50, 90])
def test_weights_split_the_ids(canary: int) -> None:
    router = Router([config(v1=100 - canary, v2=canary)])
    share = sum(router.choose(MODEL, i) == "v2" for i in IDS) / len(IDS)
    assert share == pytest.approx(canary / 100, abs=0.02)


def test_a_version_of_weight_zero_gets_nothing() -> None:
    router = Router([config(v1=100, v2=0)])
    assert {router.choose(MODEL, i) for i in IDS} == {"v1"}


def test_an_id_is_sticky_across_routers_and_calls() -> None:
    first, second = Router([config(v1=50, v2=50)]), Router([config(v1=50, v2=50)])
    for i in IDS[:1000]:
        assert first.choose(MODEL, i) == first.choose(MODEL, i) == second.choose(MODEL, i)


def test_the_bucket_is_crc32_mod_100_and_stable_across_processes() -> None:
    # pinned values: every gateway, worker and `ticketflow config route-test` must agree
    assert [bucket_of("ticket-1"), bucket_of("T-42"), bucket_of("abc")] == [49, 53, 78]


def test_growing_a_canary_keeps_its_ids() -> None:
    small, large = config(v1=90, v2=10), config(v1=80, v2=20)
    on_canary = [i for i in IDS if pick_version(small, i) == "v2"]
    assert on_canary
    assert all(pick_version(large, i) == "v2" for i in on_canary)


def test_the_key_order_of_a_config_does_not_change_routing() -> None:
    a = RoutingConfig(name=MODEL, versions={"v1": 70, "v2": 30}, default="v1")
    b = RoutingConfig(name=MODEL, versions={"v2": 30, "v1": 70}, default="v1")
    assert all(pick_version(a, i) == pick_version(b, i) for i in IDS[:2000])


def test_an_explicit_version_wins() -> None:
    router = Router([config(v1=100)])
    assert router.choose(MODEL, "ticket-1", "v7") == "v7"


@pytest.mark.parametrize("bad", ["1", "v", "v0", "latest", "v1.2", "V1"])
def test_a_malformed_version_is_invalid_input(bad: str) -> None:
    with pytest.raises(GatewayError) as caught:
        Router().choose(MODEL, "ticket-1", bad)
    assert caught.value.code is ErrorCode.INVALID_INPUT
    assert not caught.value.retryable


def test_an_unknown_model_is_invalid_input_naming_the_known_ones() -> None:
    with pytest.raises(GatewayError) as caught:
        Router().choose("nope", "ticket-1")
    assert caught.value.code is ErrorCode.INVALID_INPUT
    assert "ticket_classifier" in caught.value.message


def test_update_takes_effect_on_the_next_choice() -> None:
    router = Router()
    router.update(config(v1=0, v2=100))
    assert router.choose(MODEL, "ticket-1") == "v2"
    router.update(DEFAULT_CONFIG)  # a rollback is publishing the previous config
    assert router.choose(MODEL, "ticket-1") == "v1"


def test_update_refuses_a_version_triton_cannot_be_asked_for() -> None:
    router = Router()
    with pytest.raises(GatewayError):
        router.update(RoutingConfig(name=MODEL, versions={"stable": 100}, default="stable"))
    assert router.config(MODEL) == DEFAULT_CONFIG


def test_gateway_versions_map_to_triton_versions() -> None:
    assert triton_version("v1") == "1"
    assert triton_version("v12") == "12"
