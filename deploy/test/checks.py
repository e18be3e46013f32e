"""The pass/fail tally the deploy tests print: one line per check, a summary
line, and the process exit status (1 when any check failed).

The tests import it as `from checks import Checks`; Python puts the running
script's directory (deploy/test) first on sys.path, so no PYTHONPATH is needed.
"""


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def expect(self, ok, what, detail=""):
        if ok:
            self.passed += 1
            print(f"ok: {what}")
        else:
            self.failed += 1
            print(f"FAILED: {what}" + (f"\n  {detail}" if detail else ""))

    def summary(self):
        """Prints the counts; returns the exit status."""
        print(f"{self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0
