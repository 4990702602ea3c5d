"""The summary of a training run (``summary.json``, the last lines a run prints), the same for every
``trainer.mode``: the sync loop in :mod:`.trainer` and the overlapped ones in :mod:`.overlap` use it."""

from __future__ import annotations

SUMMARY_WINDOW = 3  # steps averaged for the reward at the start and at the end of a run


def summarize(history: list[dict[str, float]], last_step: int, seconds: float) -> dict[str, float]:
    """The numbers a user checks first: reward at the start and end, speed, the final training stats.

    ``reward/first`` and ``reward/last`` are means over the first and last ``SUMMARY_WINDOW`` steps (one
    step's reward depends on which tasks it drew); ``task_reward/first|last`` likewise for an env that
    reports its unshaped score as ``env/task_reward``.
    """
    summary: dict[str, float] = {"steps": float(last_step), "time/total_seconds": seconds}
    if not history:
        return summary
    for key, name in (("reward/mean", "reward"), ("env/task_reward", "task_reward")):
        values = [h[key] for h in history if key in h]
        if values:
            summary[f"{name}/first"] = sum(values[:SUMMARY_WINDOW]) / len(values[:SUMMARY_WINDOW])
            summary[f"{name}/last"] = sum(values[-SUMMARY_WINDOW:]) / len(values[-SUMMARY_WINDOW:])
    summary["reward/best"] = max(h.get("reward/mean", 0.0) for h in history)
    last = history[-1]
    for key in ("train/loss", "train/kl", "train/entropy", "train/grad_norm", "train/logprob_gap_mean",
                "throughput/train_tokens_per_second", "rollout/generated_tokens_per_second", "time/step_seconds"):
        if key in last:
            summary[key] = last[key]
    return summary
