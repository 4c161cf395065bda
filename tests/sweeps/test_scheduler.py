"""Which task a free worker takes next: the sweep's order, except that a worker is given the tasks whose state it
already holds in memory (a plan's later rounds of a layout it simulated), and leaves another worker's to it."""

from __future__ import annotations

from castcore.sweeps.run import Scheduler, group
from castcore.sweeps.spec import Job
from castcore.sweeps.work import Task


def _tasks(*kept: str) -> list[Task]:
    return [Task(id=i, points=[(i, None)], kept=(k,)) for i, k in enumerate(kept)]


def test_a_worker_takes_the_first_task_of_what_it_holds_then_what_no_other_holds_then_any():
    scheduler = Scheduler(_tasks("a", "b", "c", "b"), on_row=lambda index, row: None)
    assert scheduler.take(here={("b",)}).id == 1
    assert scheduler.take(here={("b",)}, elsewhere={("a",)}).id == 3
    assert scheduler.take(here={("x",)}, elsewhere={("a",)}).id == 2
    assert scheduler.take(here={("x",)}, elsewhere={("a",)}).id == 0  # only another's left: taken anyway
    assert scheduler.take() is None


def test_without_preferences_the_sweep_order_holds():
    scheduler = Scheduler(_tasks("a", "b", "a"), on_row=lambda index, row: None)
    assert [scheduler.take().id for _ in range(3)] == [0, 1, 2]


def test_simulations_of_one_layout_at_other_traffic_or_replicas_keep_the_same_state():
    def job(**more):
        values = {"model": "m", "tp": 2, "weights": "fp8", "rate": 5.0, "requests": 500, "dp": 1, **more}
        return Job(command="simulate", device="h100", simulate=values)

    same = {job().kept(), job(rate=9.0, dp=4).kept(), job(requests=4000).kept()}
    assert len(same) == 1
    assert job(tp=4).kept() not in same and job(weights="bf16").kept() not in same
    other_device = Job(command="simulate", device="b200", simulate=job().simulate)
    assert other_device.kept() not in same
    tasks = group([_Point(0, job()), _Point(1, job(dp=2))])
    assert len(tasks) == 2 and tasks[0].kept == tasks[1].kept


class _Point:
    def __init__(self, index, job):
        self.index, self.job = index, job
