class Registry:
    def __init__(self):
        self.modules = {}

    def register_module(self, name=None, module=None, force=False):
        if not force and name in self.modules:
            raise KeyError(f"{name} is already registered")
        self.modules[name or module.__name__] = module
        return module

    def build(self, cfg):
        cfg = dict(cfg)
        kind = cfg.pop("type")
        return (self.modules[kind] if isinstance(kind, str) else kind)(**cfg)


MODELS = Registry()
