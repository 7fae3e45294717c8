"""The one error type a user sees: it names the bad input and says how to fix it."""


class FleetInputError(ValueError):
    """Input that vllm-fleet cannot use: a malformed file, an invalid variable, an impossible plan.

    The message must name the input (file, variable or flag), the value seen, and the fix.
    """
