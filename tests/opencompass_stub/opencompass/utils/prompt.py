class PromptList(list):
    """Prompt made of strings, role dicts ``{"role", "prompt"}`` and section markers."""
