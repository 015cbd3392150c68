def to_sagemaker(plan): raise NotImplementedError
def to_sagemaker_v1(plan): raise NotImplementedError
