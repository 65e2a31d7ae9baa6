"""Placeholder: commands of this module are being written."""


def register(sub):
    pass
