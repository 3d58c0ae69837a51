"""Why the agent leaves a field of a record empty, where more than one of its modules says it (the model probe in a
step record's ``absent``, the outbox once for a block of such steps). A module of constants alone: the outbox imports
it when the agent starts, in every process tm runs, so it imports nothing."""

NO_TOKENS = "no integer id tensor seen in the model's inputs: pass --tokens-per-step"
