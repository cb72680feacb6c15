"""Running one function in many threads at once, for tests of concurrent readers and writers."""

import threading


def run_together(task, count, setup=None, timeout_s=120.0):
    """[task(i, setup(i)) for i in range(count)], each in a thread of its own, released together by a
    barrier once every thread has done its ``setup`` (e.g. connected); results in thread order."""
    barrier = threading.Barrier(count)
    results = [None] * count

    def run(i):
        prepared = setup(i) if setup is not None else None
        barrier.wait(timeout_s)
        results[i] = task(i, prepared)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
    return results
