"""The EAGLE-3 draft trainer (``train-eagle3``): ``model`` (SGLang's draft as a torch module and the
target features it reads), ``loss`` (training-time test), ``data`` (self-distilled), ``train`` (the loop
and the command), ``checkpoint`` (the files SGLang loads), ``report`` (the training record as tables
and plots).
"""
