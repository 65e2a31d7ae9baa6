"""Schedule results, the independent verifier and the pipelined program."""

from twill.schedule.result import SCHEDULE_FORMAT, Schedule, WarpGroup

__all__ = ["SCHEDULE_FORMAT", "Schedule", "WarpGroup"]
