"""Predict, then reveal: a guess written down before a plot, told right or wrong after it, with the reason.

Not graded (a prediction can be changed after the plot is seen; its worth is in being made first). In a
graded kernel too, so it is one of the view's kernel files.
"""

from __future__ import annotations


def reveal(guess, truth, why: str) -> None:
    """Print whether ``guess`` was ``truth``, and ``why``."""
    if guess is None:
        print(f"No prediction was written above: it is {truth!r}. {why}\n(Next time, guess first: a guess that "
              "turns out wrong is where a misconception shows itself.)")
        return
    right = guess == truth or str(guess).strip().lower() == str(truth).lower()
    print(f"You predicted {guess!r}: {'right' if right else f'it is {truth!r}'}. {why}")
