def to_deepspeed(plan): raise NotImplementedError
