"""What tests and first GPU runs need from the package: ``tiny`` (tiny random checkpoints, a Llama
target and two EAGLE-3 drafts) and ``standins`` (empty torchvision/vllm modules so SGLang imports on a
CPU machine).
"""
