"""The engine's timers are a deployment's settings (perfd.engine.subjects.EngineConfig: --engine-lease-ttl,
--engine-ack-wait): the hold a shard puts on a message for its windows is derived under the ack wait
whatever it is."""

from __future__ import annotations

import pytest

from perfd.engine import subjects as S


@pytest.mark.parametrize("ack_wait_s, hold_s",
                         [(10.0, 7.0), (6.0, 3.0), (4.0, 2.0), (1.0, 0.5), (30.0, 27.0)])
def test_the_hold_is_under_the_ack_wait(ack_wait_s: float, hold_s: float) -> None:
    cfg = S.EngineConfig(("nats://unused",), ack_wait_s=ack_wait_s)
    assert cfg.hold_s == hold_s
    assert 0 < cfg.hold_s < cfg.ack_wait_s


def test_the_defaults_are_the_engines() -> None:
    cfg = S.EngineConfig(("nats://unused",))
    assert (cfg.lease_ttl_s, cfg.renew_s, cfg.ack_wait_s, cfg.hold_s) == (6.0, 2.0, 10.0, 7.0)
