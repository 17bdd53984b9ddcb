from pathlib import Path

import pytest

from perfd.collectors.megatron import parse_file
from perfd.core.jobinfo_json import job_info_from_json, job_info_to_json

DATA = Path(__file__).resolve().parent / "data" / "megatron"


@pytest.mark.parametrize("log", sorted(DATA.glob("*.log")), ids=lambda p: p.stem)
def test_round_trip_of_real_job_info(log):
    info = parse_file(log).job_info
    assert info.arguments, "the real log has an arguments block"
    back = job_info_from_json(job_info_to_json(info))
    assert back == info


def test_unknown_keys_are_ignored_and_garbage_refused():
    info = job_info_from_json('{"framework": "megatron", "new_field": 1, "layout": {"tp": 2, "x": 3}}')
    assert info.layout.tp == 2 and info.layout.pp is None
    with pytest.raises(ValueError):
        job_info_from_json("[1, 2]")
