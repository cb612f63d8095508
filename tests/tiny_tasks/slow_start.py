"""A task whose data take a minute to prepare, as a large corpus's do, used only by
tests/test_train.py: a SIGTERM while a run prepares must stop it at once."""

import time

from tiny_tasks.reverse import ReverseTask


class SlowStartTask(ReverseTask):
    def __init__(self, cfg, per_step: int = 1):
        time.sleep(60)  # preparing the data
        super().__init__(cfg, per_step)


TASK = SlowStartTask
