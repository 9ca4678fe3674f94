// The device suite compiled by nvcc for a real CUDA device (see device_test.cpp).
#include "device_test.cpp"
