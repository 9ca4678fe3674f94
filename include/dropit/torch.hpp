/**
 * @file torch.hpp
 * @brief The LibTorch adapter: dropit layers for LibTorch's autograd engine, `to_dropit`, the
 * counting CPU allocator and the payload memory resource. Needs LibTorch; never included by
 * `dropit.hpp`.
 *
 * | header | what |
 * | --- | --- |
 * | torch/policy.hpp | `policy{kind, gamma, seed}`, `live_saved_bytes()` |
 * | torch/functional.hpp | `linear`, `conv2d`, ...; `[leaky_]relu`, `hardtanh`, `*_pool2d` |
 * | torch/modules.hpp | their modules: `Linear`, ..., `LeakyReLU`, `MaxPool2d`, `AvgPool2d`, ... |
 * | torch/multihead_attention.hpp | `MultiheadAttention`: projections, attention via dropit |
 * | torch/store.hpp | `layer_norm`, `batch_norm`, `gelu`, `activation`, ... through a codec |
 * | torch/store_modules.hpp | `LayerNorm`, `BatchNorm1d/2d/3d`, `GELU`, `SiLU`, ..., `Dropout` |
 * | torch/transformer.hpp | `Transformer{Encoder,Decoder}[Layer]` on dropit's modules |
 * | torch/convert.hpp | `to_dropit(module, policy, {.store = ...})` |
 * | torch/counting_allocator.hpp | `counting_allocator`, `cpu_allocator_guard` |
 * | torch/memory_resource.hpp | `cpu_resource()`: payloads from LibTorch's CPU allocator |
 * | torch/packed.hpp | `packed_tensor`, `packed_mask`, `packed_pool_indices`: hook packs |
 */
#pragma once

#include <dropit/torch/convert.hpp>
#include <dropit/torch/counting_allocator.hpp>
#include <dropit/torch/functional.hpp>
#include <dropit/torch/memory_resource.hpp>
#include <dropit/torch/modules.hpp>
#include <dropit/torch/multihead_attention.hpp>
#include <dropit/torch/packed.hpp>
#include <dropit/torch/policy.hpp>
#include <dropit/torch/store.hpp>
#include <dropit/torch/store_modules.hpp>
#include <dropit/torch/transformer.hpp>
