"""Markers the test files share."""


def pytest_configure(config):
    config.addinivalue_line("markers", "speed: checks a time budget of the search (acceptance timings measured on "
                                       "2 idle cores); `-m 'not speed'` skips them on a loaded machine")
