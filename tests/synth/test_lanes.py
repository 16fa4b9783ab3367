"""Lanes and devices: items reach whichever lane is free, also items added while the group runs;
the deadline and stop end a group; each lane group measures under its own device's lock, and the
names a lane and its parent give one GPU lead to the same lock."""

from __future__ import annotations

import queue
import time

import pytest

from cuda_agent.synth import device_lock
from cuda_agent.synth.devices import LaneDevice, lane_devices, spread
from cuda_agent.synth.lanes import LaneGroup, next_finished, run_in_lanes


def test_items_added_while_running_reach_idle_lanes_and_a_faster_lane_takes_more() -> None:
    outbox: queue.Queue = queue.Queue()
    group = LaneGroup("stage", [lambda item: time.sleep(0.002) or item, lambda item: time.sleep(0.02) or item],
                      outbox)
    group.put(range(10))
    first = next_finished(outbox, [group], deadline=None)
    group.put(range(10, 40))  # work that arrives while the stage runs (composed tasks reaching the filter)
    group.close()
    finished = [first]
    while (item := next_finished(outbox, [group], deadline=None)) is not None:
        finished.append(item)
    assert sorted(f.result() for f in finished) == list(range(40))
    per_lane = {lane: sum(f.lane == lane for f in finished) for lane in (0, 1)}
    assert per_lane[0] > 2 * per_lane[1] > 0  # lanes pull: the quick one is never left waiting for the slow one


def test_no_item_starts_after_the_deadline_and_the_rest_stay_queued() -> None:
    outbox: queue.Queue = queue.Queue()
    deadline = time.monotonic() + 0.3
    group = LaneGroup("stage", [lambda item: time.sleep(0.1) or item], outbox, deadline)
    group.put(range(100))
    group.close()
    done = []
    while (item := next_finished(outbox, [group], deadline)) is not None:
        done.append(item.result())
    assert 1 <= len(done) <= 4 and group.queued >= 95


def test_a_lane_error_is_raised_in_the_consumer_and_stop_ends_idle_lanes() -> None:
    def lane(item: int) -> int:
        if item == 3:
            raise RuntimeError("lane failed on 3")
        return item

    results = run_in_lanes([lane, lane], range(6))
    with pytest.raises(RuntimeError, match="lane failed on 3"):
        list(results)
    outbox: queue.Queue = queue.Queue()
    group = LaneGroup("idle", [lambda item: item] * 3, outbox)
    group.stop()
    assert _eventually(lambda: not any(thread.is_alive() for thread in group._threads))


def _eventually(predicate, timeout_s: float = 5.0) -> bool:
    stop = time.monotonic() + timeout_s
    while time.monotonic() < stop:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_cpu_lane_groups_are_named_and_spread_round_robin() -> None:
    devices = lane_devices("cpu", ["cpu:0", "cpu:1"])
    assert [d.name for d in devices] == ["cpu:0", "cpu:1"] and devices[0].env() == {"CUDA_VISIBLE_DEVICES": ""}
    assert [d.name for d in spread(5, devices)] == ["cpu:0", "cpu:1", "cpu:0", "cpu:1", "cpu:0"]
    assert lane_devices("cpu") == [LaneDevice("cpu")]
    with pytest.raises(ValueError, match="lane groups named cpu or cpu:<k>"):
        lane_devices("cpu", ["gpu0"])
    with pytest.raises(ValueError, match="twice"):
        lane_devices("cpu", ["cpu:0", "cpu:0"])


def test_gpu_lanes_each_see_one_gpu_and_lock_it_by_its_physical_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    devices = lane_devices("cuda")
    assert [(d.name, d.visible) for d in devices] == [("cuda:0", "4"), ("cuda:1", "5"), ("cuda:2", "6"),
                                                       ("cuda:3", "7")]
    lanes = spread(16, devices)
    assert all(sum(lane == device for lane in lanes) == 4 for device in devices)
    assert lanes[2].env() == {"CUDA_VISIBLE_DEVICES": "6"}
    assert lane_devices("cuda", ["6"]) == [LaneDevice("cuda:2", "6")]
    with pytest.raises(ValueError, match=r"GPU\(s\) \['9'\] are not visible here"):
        lane_devices("cuda", ["9"])
    parent_name = device_lock.lock_file("cuda:2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6")  # what the lane's own process sees
    assert device_lock.lock_file("cuda") == parent_name
    assert device_lock.lock_name("cuda") == "gpu-6"  # the evaluation pool's lock name for that GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ValueError, match="no GPU is visible"):
        lane_devices("cuda")
