"""toy: a fourth study for tests/test_toy_study.py, the differentially private mean image of the
training split of a MedMNIST-like dataset it registers (the Gaussian mechanism on clipped
images). It is copied into a scratch copy of the repository with one registration line; it
never ships."""
