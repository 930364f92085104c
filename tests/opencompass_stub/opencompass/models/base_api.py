from opencompass.utils.prompt import PromptList


class APITemplateParser:
    """Keeps the turns: a prompt list becomes a PromptList of ``{"role", "prompt"}`` (sections dropped; in
    ``gen`` mode the trailing empty turn the model is to write is dropped too)."""

    def __init__(self, meta_template=None):
        self.meta_template = meta_template

    def parse_template(self, prompt_template, mode):
        if not isinstance(prompt_template, (str, PromptList)):
            return [self.parse_template(p, mode=mode) for p in prompt_template]
        if isinstance(prompt_template, str):
            return prompt_template
        turns = PromptList({"role": p["role"], "prompt": p.get("prompt", "")} for p in prompt_template
                           if isinstance(p, dict) and "role" in p)
        while mode == "gen" and turns and not turns[-1]["prompt"]:
            turns.pop()
        return turns
