from opencompass.utils.prompt import PromptList


def _is_section(item):
    return isinstance(item, dict) and "section" in item


class LMTemplateParser:
    """Without a meta template: strings pass through, a prompt list becomes its prompts joined by newlines."""

    def __init__(self, meta_template=None):
        self.meta_template = meta_template

    def parse_template(self, prompt_template, mode):
        if not isinstance(prompt_template, (str, PromptList)):
            return [self.parse_template(p, mode=mode) for p in prompt_template]
        if isinstance(prompt_template, str):
            return prompt_template
        parts = [p if isinstance(p, str) else p.get("prompt", "") for p in prompt_template if not _is_section(p)]
        return "\n".join(p for p in parts if p)


class BaseModel:
    is_api = False

    def __init__(self, path, max_seq_len=2048, tokenizer_only=False, meta_template=None, generation_kwargs=dict(),
                 sync_rank=False):
        self.path = path
        self.max_seq_len = max_seq_len
        self.tokenizer_only = tokenizer_only
        self.template_parser = LMTemplateParser(meta_template)
        self.eos_token_id = None
        self.generation_kwargs = generation_kwargs
        self.sync_rank = sync_rank

    def parse_template(self, prompt_template, mode):
        return self.template_parser.parse_template(prompt_template, mode)

    def get_ppl_from_template(self, templates, mask_length=None):
        return self.get_ppl(self.parse_template(templates, mode="ppl"), mask_length)

    def generate_from_template(self, templates, max_out_len, **kwargs):
        return self.generate(self.parse_template(templates, mode="gen"), max_out_len=max_out_len, **kwargs)

    def get_token_len_from_template(self, templates, mode="ppl"):
        prompts = self.parse_template(templates, mode=mode)
        if isinstance(prompts, list) and not isinstance(prompts, PromptList):
            return [self.get_token_len(str(p)) for p in prompts]
        return self.get_token_len(str(prompts))
