"""The installed validator packages under site/ are not tests."""

collect_ignore = ["site"]
