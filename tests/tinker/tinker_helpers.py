"""Steps shared by the tinker tests."""

from __future__ import annotations

from tinker import types


def train_a_little(client, steps: int, learning_rate: float) -> None:
    """``steps`` of cross-entropy + Adam on one fixed 19-token datum, through the client."""
    tokens = list(range(20, 40))
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:]})
    for _ in range(steps):
        client.forward_backward([datum], "cross_entropy")
        client.optim_step(types.AdamParams(learning_rate=learning_rate)).result()
