"""The evidence-selection task: find verbatim evidence for a question in several papers."""
