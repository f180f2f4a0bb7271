"""The check / exit protocol of the script tests in tests/python (run by nib_tests from the repository root):
check() records and prints a failure and goes on; finish() prints the verdict and exits 1 on any failure."""
import sys

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what)


def finish(name):
    print("%s: %s" % (name, "%d failure(s)" % len(failures) if failures else "ok"))
    sys.exit(1 if failures else 0)
