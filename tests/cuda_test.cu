// The device suite compiled by nvcc for a real CUDA device (see cuda_suite.cpp).
#include "cuda_suite.cpp"
