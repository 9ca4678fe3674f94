"""The save-for-backward hooks: ``to_dropit`` (per layer) and ``saved_tensors`` (a block).

``to_dropit`` registers, on each selected layer, a forward pre-hook that opens PyTorch's
``saved_tensors_hooks`` around the layer's forward and a forward hook that closes it (the last
pre-hook and the first forward hook of the module, so a user's hooks run outside: `_in_order`).
Inside, the pack hook hands dropit's C++ library only the tensors it must:

* Linear / Conv1D with a lossy policy: the layer's matmul runs through dropit's C++ function
  (``_C._linear``, ``_C._conv1d``), which packs the input and computes the weight gradient from
  it in pieces of rows (the rebuilt input never exists whole in backward); the layer's pre-hook
  enters the ``TorchFunctionMode`` below, which routes the layer's own ``F.linear`` (GPT-2's
  ``torch.addmm``) call there. What that function does not take (autocast, a tensor subclass, an
  input computed in the forward, a weight that is no parameter) and a lossless policy (gamma 0,
  exact values: PyTorch's gradients bit for bit) take the hook path below. An nn.Linear whose
  forward is nn.Linear's own (that call alone) opens the saved-tensor hooks only around the call
  when PyTorch runs it, so the C++ Linear's saved tensors skip the Python hooks. With
  ``low_memory=True`` a Conv2d's own ``F.conv2d`` goes the same way (``_C._conv2d``: forward and
  backward in pieces of samples).
* nn.MultiheadAttention: its in and out projections (``F.linear`` calls inside its functional
  forward; ``out_proj``'s own forward never runs) go to the same C++ Linear: the mode runs a copy
  of ``F.multi_head_attention_forward`` whose ``F.linear`` routes them (``_with_projections``).
* Linear / Conv1D / every convolution (Conv1d/2d/3d, ConvTranspose1d/2d/3d) through the hooks: the
  layer's input, and what the layer derives from it before its matmul or convolution (a view, an
  autocast copy, a padded copy). That tensor feeds only the weight gradient. Parameters, their
  views and copies (the weight, an autocast weight) are saved as they are, so the input gradient
  stays exact. A layer whose forward is its own (a subclass's, an instance's, GPT-2's Conv1D)
  packs only the input of its F.linear / addmm / convolution call whose weight is a parameter
  (or the copy the call makes of it): its forward may save the input for other ops too.
* ReLU: it runs through dropit's C++ kernel (``_C._relu``, ``_C._relu_``), which saves 1 bit per
  element and computes the gradient from the bits (no dense tensor in backward); for a tensor
  subclass PyTorch's relu runs and its saved output becomes a 1-bit mask.
* MaxPool2d: its pooling runs through dropit's C++ kernel (``_C._max_pool2d``), which saves, per
  output, the window position of its maximum (2 bits for a 2x2 window) instead of the input and
  int64 indices; output and gradient are PyTorch's, ties, NaNs and double backward included. The
  layer's pre-hook enters a ``TorchFunctionMode`` that routes its ``F.max_pool2d`` call there
  (and its hook leaves it; a ReLU layer's ``F.relu`` likewise); what the kernel does not take
  (``return_indices``, a non-contiguous or non-CPU input, another dtype) runs in PyTorch, whose
  int64 indices then become window positions and whose saved input (read by backward for its
  shape only) a shape; so does the input a Conv2d's padding mode pads.
* MaxPool2d then ReLU in an nn.Sequential (``fuse_pool_relu``, on by default): the pooling runs
  ``_C._max_pool2d_relu``, which applies the ReLU and saves its 1-bit mask plus window positions
  only for the outputs the ReLU passes; the ReLU returns its input (`_fusing_relu`, `_absorbs`).

* F.relu (``torch.relu``, ``Tensor.relu``, ``relu_``) and F.max_pool2d in a module's own
  forward (PyTorch's tutorials, ``nn.TransformerEncoderLayer``'s activation): a module whose
  class's methods name them, or that holds one of those functions as an attribute, gets a
  "functional" scope, which enters the same mode around its forward; the calls made while it is
  the innermost scope go to the ReLU and pooling kernels. A Linear / convolution subclass
  whose own code calls them (an activation after its op) routes them the same way from its
  "weight" scope (with strategy "none", which leaves its op to PyTorch, it is a "functional"
  one). An excluded module inside it gets a "dense" scope, which stops that. What the kernels do
  not take runs in PyTorch as it is.

The masks and shapes below stand for what the layer's own op reads: a ReLU, pooling, LeakyReLU or
Hardtanh subclass with its own forward keeps what it saves as it is (its F.relu / F.max_pool2d
calls still go to the kernels, as a "functional" module's).

LeakyReLU and ReLU6 / Hardtanh (any bounds): their saved input (in place: output) becomes
1 bit per element, restored as a tensor their backward reads the same way (``_pack_mask``).
Average poolings (AvgPool1d/2d/3d, AdaptiveAvgPool1d/2d/3d): their saved input, a contiguous one,
becomes its shape (their backward reads nothing else).

With ``store=`` the tensors DropIT leaves dense are kept through a value codec (a dense
``Identity`` pack with ``store_codec``), each class on its own:

* "layernorm": an ``nn.LayerNorm``'s saved input (its mean and 1/std stay as they are);
* "gelu": an ``nn.GELU``'s saved input (or a module's that holds F.gelu as an attribute and
  calls it: Hugging Face's GELUActivation);
* "softmax": an ``nn.Softmax``'s saved output, and the softmax outputs saved inside an attention
  module (``nn.MultiheadAttention``, or any module whose class name ends in "Attention");
* "matmul": every other activation an attention module saves (the matmuls' inputs: q, k, v and
  what multiplies v), Linear/Conv layers with their own hooks excepted;
* "dropout": an ``nn.Dropout``'s saved noise (0 or 1 / (1 - p)) as 1 bit per element, exact;
* "batchnorm": an ``nn.BatchNorm1d/2d/3d``'s (or SyncBatchNorm's) saved input in training (its
  batch mean and 1/std stay as they are): in a CNN with DropIT, what its convolutions output;
* "activation": what ``nn.SiLU``, ``Mish``, ``Hardswish``, ``Hardsigmoid``, ``ELU``, ``CELU``,
  ``Softplus``, ``Tanh`` and ``Sigmoid`` save (their input, or output), and a module that holds
  their function (F.silu, torch.tanh, ...) as an attribute.

A LayerNorm / BatchNorm / GELU / Softmax / activation module whose forward is its own (a
subclass's, a module holding the function) stores only what its F.layer_norm (F.batch_norm,
F.gelu, ...) call saves (`_STORE_OPS`).

Everything else passes through unchanged.
"""
import sys
import threading
import types
import weakref

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from . import _C

_push_hooks = torch._C._autograd._push_saved_tensors_default_hooks
_pop_hooks = torch._C._autograd._pop_saved_tensors_default_hooks

_local = threading.local()

# Autograd nodes through which a parameter only changes its view or dtype.
_VIEW_NODES = frozenset(
    "TBackward0 TransposeBackward0 PermuteBackward0 ViewBackward0 ReshapeAliasBackward0 "
    "UnsafeViewBackward0 ExpandBackward0 AsStridedBackward0 ToCopyBackward0 SliceBackward0 "
    "SelectBackward0 SqueezeBackward0 SqueezeBackward1 UnsqueezeBackward0 AliasBackward0".split()
)


def _detached(t):
    """A saved tensor kept as it is, as the pack hook hands it to the graph. With a pack hook,
    PyTorch 1.13 keeps the Python object the hook returns; when that is the saved tensor itself
    and it has a grad_fn, a forward whose graph is dropped without a backward is never freed
    (nn.MultiheadAttention's softmax output, say: a reference cycle through C++ that Python's
    collector cannot see). A detached alias (same storage and version counter) breaks it; the
    unpacked tensor gets the saved tensor's autograd edge back from PyTorch either way."""
    return t.detach() if t.grad_fn is not None else t


def _unpack(obj):
    """The unpack hook of every dropit scope: rebuild what pack made, pass tensors through."""
    return obj if isinstance(obj, torch.Tensor) else obj.restore()


class _ShapeOnly:
    """A saved tensor whose backward reads only its sizes and dtype: MaxPool2d's input, an
    average pooling's input, and the input a convolution's padding mode pads."""

    __slots__ = ("shape", "dtype")

    def __init__(self, t):
        self.shape, self.dtype = t.shape, t.dtype

    def restore(self):
        return torch.zeros((), dtype=self.dtype).expand(self.shape)


def _is_parameter(t):
    # nn.Parameter's isinstance goes through a Python-level metaclass hook: test the common
    # plain-tensor case by type first.
    return t is not None and type(t) is not torch.Tensor and isinstance(t, nn.Parameter)


def _is_parameter_like(t):
    """A parameter, a view of one, or a view/dtype copy of one made under autograd."""
    if _is_parameter(t) or _is_parameter(t._base):
        return True
    node = t.grad_fn
    for _ in range(4):
        if node is None or type(node).__name__ not in _VIEW_NODES:
            break
        nxt = node.next_functions
        if not nxt:
            return False
        node = nxt[0][0]
    return node is not None and _is_parameter(getattr(node, "variable", None))


def _derives_from(node, x):
    """Whether autograd node `node` reaches x within a few steps (x's own node, or the gradient
    accumulator of a leaf x) without passing through a layer's op (a matmul, a convolution, or any
    op that takes a parameter): t was computed from x inside the layer before its matmul or
    convolution (padding, a cast, a scaling), not from that op's output (a Linear subclass that
    applies an activation after it: what the activation saves must stay exact)."""
    target = x.grad_fn
    seen, frontier = 0, [node]
    for _ in range(12):  # circular padding: 4 slice assignments, each 2 or 3 nodes deep
        nxt = []
        for n in frontier:
            if n is None:
                continue
            if (n is target) if target is not None else (getattr(n, "variable", None) is x):
                return True
            seen += 1
            if seen > 64:
                return False
            if _is_layer_op(n):
                continue
            nxt.extend(f for f, _ in n.next_functions)
        if not nxt:
            return False
        frontier = nxt
    return False


# The nodes of the ops a Linear / convolution layer runs (also with a frozen weight and bias,
# whose parameters then do not show in the graph).
_LAYER_OP_NODES = frozenset(
    "AddmmBackward0 MmBackward0 BmmBackward0 MvBackward0 AddmvBackward0 BaddbmmBackward0 "
    "LinearBackward0 MkldnnLinearBackward0 ConvolutionBackward0 ConvolutionBackward1 "
    "ConvolutionBackwardOverrideable MkldnnConvolutionBackward0 SlowConv2DBackward0 "
    "SlowConvDilated2DBackward0 SlowConvDilated3DBackward0 SlowConvTranspose2DBackward0 "
    "SlowConvTranspose3DBackward0 ConvDepthwise2DBackward0 ConvDepthwise3DBackward0".split()
)


def _is_layer_op(node):
    """Whether an autograd node is a layer's op (a matmul or convolution, dropit's C++ layers and
    kernels) or takes a parameter: the walk in `_derives_from` does not pass it."""
    name = node.name()
    if name in _LAYER_OP_NODES or name.startswith("torch::autograd::CppNode<dropit::"):
        return True
    return _takes_parameter(node)


def _takes_parameter(node):
    """Whether an autograd node's inputs include a parameter, directly or through views and casts
    of it (a matmul's weight, transposed, maybe cast by autocast)."""
    for f, _ in node.next_functions:
        for _ in range(4):
            if f is None:
                break
            v = getattr(f, "variable", None)
            if v is not None:
                if _is_parameter(v):
                    return True
                break
            if f.name() not in _VIEW_NODES or not f.next_functions:
                break
            f = f.next_functions[0][0]
    return False


def _same_data(t, x):
    """t is x or a view of x's data."""
    if t is x:
        return True
    base = t._base
    return base is not None and (base is x or base is x._base)


# The classes of tensors ``store=`` can keep through a codec.
STORE_CLASSES = ("layernorm", "gelu", "softmax", "matmul", "dropout", "batchnorm", "activation")

# The "activation" class: element-wise activations whose backward reads their input or output
# whole (ReLU, LeakyReLU and ReLU6 keep masks instead; GELU has its own class). Not SELU: its
# derivative jumps at 0, where a codec rounds the smallest values.
_ACTIVATIONS = (nn.SiLU, nn.Mish, nn.Hardswish, nn.Hardsigmoid, nn.ELU, nn.CELU, nn.Softplus,
                nn.Tanh, nn.Sigmoid)
# Their functions: a module that holds one as an attribute and calls it (Hugging Face's
# activation modules: GELUActivation holds F.gelu) is stored as the module would be.
_ACTIVATION_FUNCS = frozenset([F.silu, F.mish, F.hardswish, F.hardsigmoid, F.elu, F.celu,
                               F.softplus, torch.tanh, torch.sigmoid])
_GELU_FUNCS = frozenset([F.gelu])
# The store classes whose module, with a forward of its own, keeps only what its op saves (the
# calls of these functions): func -> the classes it serves.
_STORE_OPS = {F.layer_norm: ("layernorm",), F.batch_norm: ("batchnorm",),
              F.gelu: ("gelu",), F.softmax: ("softmax",),
              torch.softmax: ("softmax",), **{f: ("activation",) for f in _ACTIVATION_FUNCS}}
_GATED_STORE = frozenset(k for kinds in _STORE_OPS.values() for k in kinds)


def _holds(module, funcs):
    """Whether a module holds one of `funcs` as an attribute (nn.TransformerEncoderLayer holds its
    activation, Hugging Face's GELUActivation F.gelu)."""
    return any(isinstance(v, types.BuiltinFunctionType | types.FunctionType) and v in funcs
               for v in vars(module).values())


# Autograd nodes through which a tensor is the same data in another shape.
_RESHAPE_NODES = _VIEW_NODES | frozenset(["ReshapeAliasBackward0", "CloneBackward0"])


def _is_softmax_output(t):
    """t is a softmax's output, or a view of one (as a batched matmul saves it)."""
    node = t.grad_fn
    for _ in range(4):
        if node is None:
            return False
        name = type(node).__name__
        if name == "SoftmaxBackward0":
            return True
        if name not in _RESHAPE_NODES or not node.next_functions:
            return False
        node = node.next_functions[0][0]
    return False


class _Restored:
    """A view of a tensor packed earlier in the same scope (a batched matmul saving a view of the
    softmax output the softmax saved): one payload, the view rebuilt from its restore."""

    __slots__ = ("base", "size", "stride", "offset")

    def __init__(self, base, t, base_offset):
        self.base, self.size, self.stride = base, t.size(), t.stride()
        self.offset = t.storage_offset() - base_offset

    def restore(self):
        return self.base.restore().as_strided(self.size, self.stride, self.offset)


_KERNEL_DTYPES = frozenset([torch.float32, torch.float64, torch.bfloat16, torch.float16])


def _pair(v):
    """An int or a sequence of one or two ints as a pair; None when it is neither."""
    if isinstance(v, int) and not isinstance(v, bool):
        return (v, v)
    if isinstance(v, (tuple, list)) and len(v) in (1, 2) and all(
            isinstance(e, int) and not isinstance(e, bool) for e in v):
        return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])
    return None


def _pool_args(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """F.max_pool2d's arguments as dropit's kernel takes them, or None when it does not take
    them (PyTorch then runs the call, and raises what it raises for bad ones)."""
    if (return_indices or type(input) is not torch.Tensor or not input.requires_grad
            or input.device.type != "cpu" or input.layout != torch.strided
            or input.dtype not in _KERNEL_DTYPES or input.dim() not in (3, 4)
            or not input.is_contiguous() or not isinstance(ceil_mode, bool)):
        return None
    k = _pair(kernel_size)
    s = k if stride is None or (isinstance(stride, (tuple, list)) and not stride) else _pair(stride)
    p, d = _pair(padding), _pair(dilation)
    if k is None or s is None or p is None or d is None or min(k + s + d) <= 0:
        return None
    if not (0 <= p[0] <= k[0] // 2 and 0 <= p[1] <= k[1] // 2):
        return None
    return input, k, s, p, d, ceil_mode


def _relu_input(input, inplace=False):
    """(input, inplace) of F.relu when dropit's kernel takes the input, else None (PyTorch then
    runs the call)."""
    if (type(input) is not torch.Tensor or not input.requires_grad or input.device.type != "cpu"
            or input.layout != torch.strided or input.dtype not in _KERNEL_DTYPES
            or not isinstance(inplace, bool)):
        return None
    return input, inplace


_RELU_FUNCS = {F.relu: False, torch.relu: False, F.relu_: True, torch.relu_: True,
               torch.Tensor.relu: False, torch.Tensor.relu_: True}


_POOL_FUNCS = frozenset([F.max_pool2d, torch.max_pool2d])
# The names by which a forward calls them: F.relu(x), torch.relu(x), x.relu(), x.relu_(),
# F.max_pool2d(x, 2) (and self.relu(x), an nn.ReLU's, which has its own hooks anyway).
_FUNCTIONAL_NAMES = frozenset(["relu", "relu_", "max_pool2d"])


def _names_functional(code):
    """Whether a function's code (or a function or lambda defined in it) names one of
    _FUNCTIONAL_NAMES."""
    if not _FUNCTIONAL_NAMES.isdisjoint(code.co_names):
        return True
    return any(isinstance(c, types.CodeType) and _names_functional(c) for c in code.co_consts)


def _calls_functional(module):
    """Whether a module's forward may call F.relu (torch.relu, Tensor.relu, relu_) or
    F.max_pool2d itself: a method of its class (nn.Module's own excepted) names one, or it holds
    one of those functions as an attribute (nn.TransformerEncoderLayer's ``activation``).
    nn.ReLU and nn.MaxPool2d modules with their class's forward have their own hooks."""
    if isinstance(module, nn.ReLU | nn.MaxPool2d) and _stock_forward(module):
        return False
    if _holds(module, _FUNCTIONAL_FUNCS):
        return True
    cls = type(module)
    hit = _FUNCTIONAL_CLASSES.get(cls)
    if hit is None:
        hit = _FUNCTIONAL_CLASSES[cls] = any(
            isinstance(value, types.FunctionType) and _names_functional(value.__code__)
            for c in cls.__mro__[:cls.__mro__.index(nn.Module)] for value in vars(c).values())
    return hit


_FUNCTIONAL_FUNCS = frozenset(_RELU_FUNCS) | _POOL_FUNCS
# Module classes -> whether a method of theirs names a function of _FUNCTIONAL_NAMES.
_FUNCTIONAL_CLASSES = weakref.WeakKeyDictionary()

# Whether a Linear / Conv1D layer (and with to_dropit's low_memory, a Conv2d) runs its op through
# dropit's C++ function when it can (a switch for the tests, which run both paths). Conv2d takes
# the hook path unless asked: the C++ conv2d runs its convolutions in pieces of samples, which
# lowers the step's peak but made the CNN step slower (docs/results/python_linear_kernel_ab.md).
_ROUTE_WEIGHT_LAYERS = True


def _linear_args(input, weight, bias=None):
    return input, weight, bias, ()


def _addmm_args(input, mat1, mat2, *, beta=1, alpha=1, out=None):
    """torch.addmm(bias, x2, W) as GPT-2's Conv1D calls it; None for another use of addmm."""
    if out is not None or not (beta == 1 and alpha == 1) or mat1.dim() != 2:
        return None
    return mat1, mat2, input, ()


def _conv2d_args(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """F.conv2d's arguments with padding as two symmetric ints (what the C++ conv2d takes); None
    for a padding="same" that pads one side more, or arguments PyTorch refuses (it then runs the
    call and raises its own error)."""
    stride, dilation = _pair(stride), _pair(dilation)
    if stride is None or dilation is None or type(groups) is not int:
        return None
    if isinstance(padding, str):
        if padding == "valid":
            padding = (0, 0)
        elif padding == "same" and stride == (1, 1) and weight.dim() == 4:
            total = [d * (k - 1) for d, k in zip(dilation, weight.shape[2:])]
            if any(t % 2 for t in total):
                return None
            padding = (total[0] // 2, total[1] // 2)
        else:
            return None
    padding = _pair(padding)
    if padding is None:
        return None
    return input, weight, bias, (stride, padding, dilation, groups)


# func -> (its arguments as (x, weight, bias, extra) or None, dropit's function, weight's dims)
_WEIGHT_FUNCS = {F.linear: (_linear_args, _C._linear, 2), torch.addmm: (_addmm_args, _C._conv1d, 2),
                 F.conv2d: (_conv2d_args, _C._conv2d, 4)}
# The ops of a Linear / Conv1D / convolution layer with its own forward whose input is packed
# (`_Scope.op`): what else its forward saves is kept as it is.
_OP_FUNCS = frozenset(_WEIGHT_FUNCS) | {F.conv1d, F.conv3d, F.conv_transpose1d,
                                        F.conv_transpose2d, F.conv_transpose3d}


def _op_operands(func, args, kwargs):
    """(input, weight) of a call of _OP_FUNCS whose weight is a parameter (a view or a copy of
    one), else None: only then does the input serve the weight gradient alone."""
    try:
        if func is torch.addmm:
            bound = _addmm_args(*args, **kwargs)
            if bound is None:
                return None
            x, w = bound[0], bound[1]
        else:
            x = args[0] if args else kwargs["input"]
            w = args[1] if len(args) > 1 else kwargs["weight"]
    except (TypeError, KeyError):
        return None
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)
            and _is_parameter_like(w)):
        return None
    return x, w


def _kernel_takes(x, w):
    """Whether dropit's C++ Linear / Conv kernels take input x with weight w: x a plain CPU
    strided tensor (not a parameter or a view of one) of a kernel dtype, w of the same dtype, and
    no autocast (whose casts PyTorch's own op applies)."""
    return (type(x) is torch.Tensor and not _is_parameter_like(x) and x.device.type == "cpu"
            and x.layout == torch.strided and x.dtype in _KERNEL_DTYPES and w.dtype == x.dtype
            and not torch.is_autocast_cpu_enabled())


def _route_weight_layer(scope, func, args, kwargs):
    """A Linear / Conv1D layer's own matmul (a low_memory Conv2d's convolution) through dropit's
    C++ function (its backward rebuilds the input in pieces of rows / samples), or None: the call
    then runs in PyTorch and the pack hook packs the input it saves. Taken: the layer's input (or
    a view of it, not a parameter) as a plain CPU tensor, a 2-d (conv: 4-d) weight and a 1-d bias
    (or none) that are parameters, no autocast."""
    parse, run, weight_dims = _WEIGHT_FUNCS[func]
    try:
        bound = parse(*args, **kwargs)
    except TypeError:
        return None
    if bound is None:
        return None
    x, w, b, extra = bound
    x_in = scope.x() if scope.x is not None else None
    if (x_in is None or type(w) is not nn.Parameter
            or (b is not None and (type(b) is not nn.Parameter or b.dim() != 1))
            or w.dim() != weight_dims or not _kernel_takes(x, w) or not _same_data(x, x_in)):
        return None
    try:
        out = run(x, w, b, *extra, scope.policy)
    except _C.Error:  # what the C++ function refuses runs in PyTorch (which raises its own error)
        return None
    scope.op_done = True
    return out


def _projection_role(mha, w, b):
    """"in" or "out" when F.linear(x, w, b) is one of nn.MultiheadAttention `mha`'s projections
    (its weight a projection weight or a slice of in_proj_weight, its bias the matching one or
    none), else None."""
    base = w._base if w._base is not None else w
    if w is mha.out_proj.weight:
        role, bias = "out", mha.out_proj.bias
    elif base is mha.in_proj_weight or any(
            w is p for p in (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)):
        role, bias = "in", mha.in_proj_bias
    else:
        return None
    if type(w) not in (torch.Tensor, nn.Parameter):  # a tensor subclass: PyTorch's linear
        return None
    if b is not None and (bias is None or (b is not bias and b._base is not bias)
                          or b.dim() != 1):
        return None
    return role


def _projection_linear(input, weight, bias=None):
    """F.linear inside nn.MultiheadAttention's functional forward (_MHA_FORWARD)."""
    scope = _live_scope("attention")
    if scope is not None and scope.route and torch.is_grad_enabled():
        out = _route_projection(scope, (input, weight, bias), {})
        if out is not None:
            return out
    return F.linear(input, weight, bias)


def _with_projections(names):
    """A copy of F.multi_head_attention_forward (and of the helpers it calls that call
    F.linear) whose F.linear is `_projection_linear`, or None when this PyTorch has other names.
    A TorchFunctionMode sees the functional forward as one call (the mode is off while it handles
    it), so it cannot route the projections inside; this copy can."""
    scope = dict(vars(F))
    for name in names:
        f = getattr(F, name, None)
        if not isinstance(f, types.FunctionType) or "linear" not in f.__code__.co_names:
            return None
        copy = types.FunctionType(f.__code__, scope, f.__name__, f.__defaults__, f.__closure__)
        copy.__kwdefaults__ = f.__kwdefaults__
        scope[name] = copy
    scope["linear"] = _projection_linear
    return scope[names[0]]


def _route_projection(scope, args, kwargs):
    """An nn.MultiheadAttention's input or output projection (F.linear with the module's own
    weights, which its functional forward calls) through dropit's C++ Linear, as a Linear
    layer's: the projection's input saved through the policy, or None (PyTorch's linear runs; the
    input is saved as it is, or through store="matmul")."""
    try:
        x, w, b, _ = _linear_args(*args, **kwargs)
    except TypeError:
        return None
    mha = scope.module
    if not isinstance(w, torch.Tensor):
        return None
    role = _projection_role(mha, w, b)
    policy = scope.layer.projections.get(role)
    if policy is None or not _kernel_takes(x, w) or x.dim() < 2 or w.dim() != 2:
        return None
    try:
        return _C._linear(x, w, b, scope.layer.step_policy(policy))
    except _C.Error:
        return None


def _run_op(scope, op, func, args, kwargs):
    """func(*args, **kwargs) with `scope.op` set to op, (input, weight) of the call or None: what
    a layer with its own forward packs is what this call saves."""
    outer, scope.op = scope.op, op
    try:
        return func(*args, **kwargs)
    finally:
        scope.op = outer


class _KernelMode(TorchFunctionMode):
    """Routes ``F.max_pool2d`` (and ``torch.max_pool2d``) while a MaxPool2d layer's forward runs,
    ``F.relu`` (``torch.relu``, ``relu_``) while a ReLU layer's does, and ``F.linear`` /
    ``torch.addmm`` while a Linear / Conv1D layer's does (``F.conv2d`` while a low_memory
    Conv2d's does), to dropit's kernels when a gradient is wanted; every other call runs as it
    is."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _OP_FUNCS:
            scope = _live_scope("weight")
            if scope is not None and torch.is_grad_enabled():
                if scope.route and func in _WEIGHT_FUNCS:
                    out = _route_weight_layer(scope, func, args, kwargs)
                    if out is not None:
                        return out
                    if not scope.hooks:  # the layer's op in PyTorch: its saved input is packed
                        _push_hooks(scope.pack, _unpack)
                        try:
                            return func(*args, **kwargs)
                        finally:
                            _pop_hooks()
                if scope.layer.custom:  # this op's saved input is packed (`_Scope.op`)
                    return _run_op(scope, _op_operands(func, args, kwargs), func, args, kwargs)
            return func(*args, **kwargs)
        kinds = _STORE_OPS.get(func)
        if kinds is not None:
            scope = _live_scope(*kinds)
            if scope is not None and scope.layer.custom:  # its saved tensors may be stored
                x = args[0] if args else kwargs.get("input")
                op = (x, None) if isinstance(x, torch.Tensor) else None
                return _run_op(scope, op, func, args, kwargs)
            return func(*args, **kwargs)
        if func is F.multi_head_attention_forward and _MHA_FORWARD is not None:
            scope = _live_scope("attention")
            if scope is not None and scope.route and torch.is_grad_enabled():
                return _MHA_FORWARD(*args, **kwargs)
        inplace = _RELU_FUNCS.get(func)
        if (inplace is not None and torch.is_grad_enabled()
                and "relu" in _innermost_kernels()):
            try:
                bound = _relu_input(*args, **kwargs)
            except TypeError:
                bound = None
            if bound is not None:
                x, inplace_arg = bound  # F.relu's inplace= (relu_ is in place by its name)
                if _absorbs(x):  # the pooling before it applied this ReLU (`_fusing_relu`)
                    return x
                try:
                    return _C._relu_(x) if inplace or inplace_arg else _C._relu(x)
                except _C.Error:
                    pass
            return func(*args, **kwargs)
        if (func in _POOL_FUNCS and torch.is_grad_enabled()
                and "pool" in _innermost_kernels()):
            try:
                bound = _pool_args(*args, **kwargs)
            except TypeError:
                bound = None
            if bound is not None:
                relu = _fusing_relu()
                try:
                    if relu is None:
                        return _C._max_pool2d(*bound)
                    y = _C._max_pool2d_relu(*bound)
                    _local.fused = (weakref.ref(y), y._version, weakref.ref(relu))
                    return y
                except _C.Error:  # e.g. an output too small: PyTorch raises its own error
                    pass
        return func(*args, **kwargs)


_KERNEL_MODE = _KernelMode()
_MHA_FORWARD = _with_projections(
    ("multi_head_attention_forward", "_in_projection_packed", "_in_projection"))


_NO_KERNELS = frozenset()
_ALL_KERNELS = frozenset(["relu", "pool"])
_KERNELS = {"relu": frozenset(["relu"]), "pool": frozenset(["pool"]), "functional": _ALL_KERNELS}


def _lossy(policy):
    return policy.codec != "exact" or (policy.kind in ("mink", "random") and policy.gamma > 0)


class _Layer:
    """A layer to_dropit selected: what it packs and with which policy."""

    __slots__ = ("name", "kind", "policy", "store", "index", "step", "pool", "pad_mode",
                 "routes", "lone_op", "custom", "kernels", "projections", "hook_ids", "fuse")

    def __init__(self, name, kind, policy, index, module, store=frozenset(), low_memory=False,
                 functional=False, fuse=False):
        self.name, self.kind, self.policy, self.index, self.step = name, kind, policy, index, 0
        self.store = store
        # a MaxPool2d whose ReLU neighbour may be fused into its pooling (`_fusing_relu`)
        self.fuse = fuse and kind == "pool"
        # The functional calls routed to dropit's ReLU / pooling kernels while this layer is the
        # innermost scope: its own kind's, and with `functional` (a Linear / convolution subclass
        # whose own code calls F.relu or F.max_pool2d) both.
        self.kernels = _ALL_KERNELS if functional else _KERNELS.get(kind, _NO_KERNELS)
        self.pool = None
        # nn.MultiheadAttention: {"in": policy, "out": policy} of the projections routed to
        # dropit's C++ Linear (set_projections).
        self.projections = {}
        # the ids of its forward pre-hook and forward hook in the module's hook dicts
        self.hook_ids = None
        self.pad_mode = getattr(module, "padding_mode", "zeros")
        # A Linear / Conv1D (low_memory: a Conv2d) whose op may run in dropit's C++ layer: not
        # with a lossless policy (PyTorch's own backward then gives its gradients bit for bit).
        self.routes = (kind == "weight" and _lossy(policy)
                       and (isinstance(module, nn.Linear) or _is_conv1d(module)
                            or (low_memory and isinstance(module, nn.Conv2d))))
        # whether its forward is nn.Linear's own (one F.linear call, nothing else saved)
        self.lone_op = (kind == "weight" and type(module).forward is nn.Linear.forward
                        and "forward" not in vars(module))
        # A Linear / Conv1D / convolution whose forward is its own (a subclass's, an instance's,
        # GPT-2's Conv1D): it may save its input, or tensors derived from it, for other ops than
        # its matmul or convolution (x.pow(2) before F.linear), whose backward must read them as
        # they are. Only what its F.linear / addmm / convolution calls save is packed.
        # Likewise a LayerNorm / BatchNorm / GELU / activation / Softmax of a store= class: only
        # what its F.layer_norm (F.gelu, ...) call saves is stored (`_STORE_OPS`).
        self.custom = (kind == "weight" or kind in _GATED_STORE) and not _stock_forward(module)
        if kind == "pool":
            pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)  # noqa: E731
            stride = module.stride if module.stride is not None else module.kernel_size
            self.pool = (
                pair(module.kernel_size),
                pair(stride),
                pair(module.padding),
                pair(module.dilation),
                bool(module.ceil_mode),
            )

    def __getstate__(self):
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state):
        self.fuse = False  # a layer pickled before the fusion existed
        for name, value in state.items():
            setattr(self, name, value)
        # PyTorch numbers hooks from a counter of its own (RemovableHandle.next_id) and files them
        # under that number: in a process that loads a hooked model, a hook registered later must
        # not take the number of this layer's, which would replace it.
        if self.hook_ids is not None:
            handle = torch.utils.hooks.RemovableHandle
            handle.next_id = max(handle.next_id, max(self.hook_ids) + 1)

    def set_projections(self, projections):
        """An nn.MultiheadAttention's projections ({"in": policy, "out": policy}; a role left out
        stays PyTorch's): those with a lossy policy run dropit's C++ Linear."""
        self.projections = {r: p for r, p in projections.items() if p is not None and _lossy(p)}
        self.routes = bool(self.projections)

    def step_policy(self, p=None):
        """This forward's policy (or `p`'s for this call): Random draws new positions per layer
        and step (an nn.MultiheadAttention's projections: per call)."""
        p = self.policy if p is None else p
        if p.kind == "random":
            self.step += 1
            mixed = (p.seed + (self.index + 1) * 0x9E3779B97F4A7C15 + self.step) % (1 << 64)
            return p.with_seed(mixed)
        return p


class _Scope:
    """One forward of one layer: the pack hook and what it needs to know about the input."""

    __slots__ = ("layer", "module", "frame", "x", "x_requires_grad", "policy", "memo", "mode",
                 "route", "hooks", "op_done", "op")

    def __init__(self, layer, module, frame, x):
        # module: the one called (a deepcopy or unpickled copy of a hooked model shares no
        # module with the layer's original)
        self.layer, self.module, self.frame = layer, module, frame
        # Weak: the pack hook lives as long as the graph; the input must not.
        self.x = weakref.ref(x) if isinstance(x, torch.Tensor) else None
        self.x_requires_grad = isinstance(x, torch.Tensor) and x.requires_grad
        self.policy = layer.step_policy() if layer.kind == "weight" else layer.policy
        # attention: id(tensor) -> (tensor, pack) of the dense tensors packed in this forward, so
        # that a tensor saved twice (or a view of it) is held once. Emptied when the forward ends.
        self.memo = {} if layer.kind == "attention" else None
        self.mode = False  # whether this scope entered _KERNEL_MODE
        # whether it opened saved-tensor hooks: a "functional" scope (a module whose own code
        # calls F.relu or F.max_pool2d) only routes those calls, a "dense" one (an excluded
        # module inside one) only stops that routing
        self.route = _ROUTE_WEIGHT_LAYERS and layer.routes  # enters _KERNEL_MODE for its op
        # An nn.Linear's forward is its F.linear call alone: routed, its scope opens the hooks
        # only around that call when PyTorch runs it (`_KernelMode`), not for dropit's C++
        # Linear, whose saved tensors (the weight, the payload) pass the hooks unchanged.
        self.hooks = layer.kind not in ("functional", "dense") and not (
            self.route and layer.lone_op)
        # whether the layer's op (matmul, convolution) has run: it saved its input (packed here)
        # or its weight, or dropit's C++ layer ran it; a tensor without autograd history saved
        # after it is no copy of the input (a dropout's noise on the output, say)
        self.op_done = False
        # (input, weight) of the layer's op (_OP_FUNCS) running now, for a layer with its own
        # forward: only that input (or a copy the op makes of it) is packed
        self.op = None

    def live(self):
        """Whether this layer's forward is still running on this thread (it is not after an
        exception escaped it; the scope is then stale and packs nothing)."""
        f = sys._getframe(2)
        target = self.frame
        while f is not None:
            if f is target:
                return True
            f = f.f_back
        return False

    def pack(self, t):
        out = self._pack(t)
        return _detached(t) if out is t else out

    def _pack(self, t):
        if self.frame is None or not self.live():
            return t
        x = self.x() if self.x is not None else None
        kind = self.layer.kind
        if kind == "weight":
            if self.layer.custom:
                return self._pack_op_input(t)
            if self._is_input(t, x):
                if self.layer.pad_mode != "zeros" and _same_data(t, x):
                    # A Conv2d with a padding mode pads x first; the padding op saves x for its
                    # backward, which reads only x's shape. The convolution's input is the padded
                    # copy, packed below when it is saved.
                    return _ShapeOnly(t)
                packed = _C._pack_saved(t, self.policy)
                self.op_done = True  # the op that saves its input (the one packed) has run
                return packed
            return t
        if kind in _STORE_KINDS:
            return self._pack_stored(t, x, kind)
        if x is None:
            return t
        if kind == "relu":
            if t.is_floating_point() and t.shape == x.shape:
                # Restores as a 0/1 tensor of t's dtype: a bool one would be a quarter of the
                # bytes, but threshold_backward converts it first (about 3x slower: docs/python.md).
                return _C._pack_relu(t)
            return t
        if kind == "mask":
            return self._pack_mask(t, x)
        if kind == "avgpool":
            # Its backward reads the input's sizes only. A channels-last input stays as it is:
            # the gradient takes the saved tensor's memory format, which a shape cannot carry.
            if t.is_floating_point() and _same_data(t, x) and t.is_contiguous():
                return _ShapeOnly(t)
            return t
        # pool: the int64 indices, and the input (read for its shape)
        if t.dtype == torch.int64 and t.dim() >= 3:
            try:
                return _C._pack_pool_indices(t, x.shape[-2], x.shape[-1], *self.layer.pool)
            except _C.Error:  # not this module's window (a forward pooling with other arguments)
                return t
        if _same_data(t, x):
            return _ShapeOnly(t)
        return t

    def _pack_op_input(self, t):
        """A Linear / convolution layer with its own forward: t packed where it is the input of
        the layer's op running now (or the copy autocast makes of it inside the op), else kept as
        it is (what another op of the forward saves, the weight)."""
        if self.op is None or not t.is_floating_point() or _is_parameter_like(t):
            return t
        x, w = self.op
        if _same_data(t, x):
            take = True
        elif t.grad_fn is not None:
            take = _derives_from(t.grad_fn, x)
        else:
            # No history: a copy of an input that needs no gradient, unless it is the copy of a
            # frozen weight (the only other tensor the op saves; a trainable one's has history).
            take = not x.requires_grad and w.requires_grad and t.shape == x.shape
        return _C._pack_saved(t, self.policy) if take else t

    def _pack_stored(self, t, x, kind):
        """The store= classes: a dense pack with the store codec, or a dropout's bits."""
        if kind == "pass" or not t.is_floating_point() or t.dim() == 0 or _is_parameter_like(t):
            return t
        if self.layer.custom and kind in _GATED_STORE:
            # A forward of its own (a subclass's, Hugging Face's GELUActivation): only what the
            # class's op saves, while it runs, measured against that op's input.
            if self.op is None:
                return t
            x = self.op[0]
        if kind == "layernorm" or kind == "gelu" or kind == "batchnorm":
            return _C._pack_saved(t, self.policy) if x is not None and _same_data(t, x) else t
        if kind == "activation":  # its input, a copy of it (in place) or its output
            return _C._pack_saved(t, self.policy) if x is not None and t.shape == x.shape else t
        if kind == "softmax":
            return _C._pack_saved(t, self.policy) if _is_softmax_output(t) else t
        if kind == "dropout":
            return self._pack_noise(t, x)
        # attention
        store = self.layer.store
        if t.grad_fn is None and not t.requires_grad and "dropout" in store:
            noise = self._pack_noise(t, x)
            if noise is not t:
                return noise
        cls = "softmax" if _is_softmax_output(t) else "matmul"
        if cls not in store:
            return t
        memo = self.memo
        hit = memo.get(id(t))
        if hit is not None and hit[0] is t:
            return hit[1]
        base = t._base
        if base is not None:
            hit = memo.get(id(base))
            if hit is not None and hit[0] is base:
                return _Restored(hit[1], t, base.storage_offset())
        packed = _C._pack_saved(t, self.policy)
        if t.is_contiguous():  # its restore has t's layout: views of it can be rebuilt
            memo[id(t)] = (t, packed)
        return packed

    def _pack_mask(self, t, x):
        """A LeakyReLU's or a Hardtanh's (ReLU6's) saved input (or, in place, result) t as 1 bit
        per element: where its backward passes the gradient as is. The bits restore to a tensor
        that its backward reads the same way: for LeakyReLU 1 where t > 0 and 0 elsewhere
        (`t > 0 ? g : g * slope`), for Hardtanh(lo, hi) a value strictly inside the bounds where
        lo < t < hi and lo elsewhere. A NaN blocks the Hardtanh gradient, as PyTorch 1.13's
        vectorized hardtanh_backward does (its scalar tail lets it through)."""
        if not t.is_floating_point() or t.shape != x.shape or _is_parameter_like(t):
            return t
        module = self.module
        try:
            if isinstance(module, nn.LeakyReLU):
                return _C._pack_leaky_relu(t)
            return _C._pack_hardtanh(t, float(module.min_val), float(module.max_val))
        except _C.Error:
            return t

    @staticmethod
    def _pack_noise(t, x):
        if x is not None and _same_data(t, x):
            return t
        try:
            return _C._pack_dropout(t)
        except _C.Error:  # not a dropout's noise (e.g. an AlphaDropout's tensors): as it is
            return t

    def _is_input(self, t, x):
        if not t.is_floating_point():
            return False
        if _is_parameter_like(t):
            self.op_done = True
            return False
        if x is not None and _same_data(t, x):
            return True
        node = t.grad_fn
        if node is not None:
            return x is not None and _derives_from(node, x)
        # No autograd history: a copy of x when x needs no gradient (then only the weight
        # gradient, which reads x, is computed) and the layer's op has not run yet; else a frozen
        # parameter's copy or something computed from the op's output.
        return not t.requires_grad and not self.x_requires_grad and not self.op_done


def _stack():
    s = getattr(_local, "stack", None)
    if s is None:
        s = _local.stack = []
    return s


def _drop_stale(stack):
    """Closes scopes whose forward raised (their forward hook never ran)."""
    while stack and not _on_stack(stack[-1].frame):
        _close(stack.pop())


def _live_scope(*kinds):
    """The innermost dropit scope on this thread when it is a layer of one of `kinds` whose
    forward is still running, else None: a mode that a forward which raised left entered routes
    nothing."""
    stack = _stack()
    if not stack:
        return None
    top = stack[-1]
    if top.layer.kind in kinds and top.frame is not None and _on_stack(top.frame):
        return top
    return None


def _innermost_kernels():
    """What the innermost dropit scope on this thread whose forward is still running routes to
    dropit's kernels (`_Layer.kernels`), or nothing: F.relu goes to the ReLU kernel in a "relu"
    scope or one of a module whose own code calls it (a "functional" module, or a Linear /
    convolution subclass), not inside an excluded module, whose "dense" scope stops it;
    F.max_pool2d likewise in a "pool" scope or such a module's."""
    stack = _stack()
    if not stack:
        return _NO_KERNELS
    top = stack[-1]
    return top.layer.kernels if top.frame is not None and _on_stack(top.frame) else _NO_KERNELS


_SEQUENTIAL_FORWARD = nn.Sequential.forward.__code__
_MODULE_GLOBALS = torch.nn.modules.module


def _only_dropit_hooks(module):
    """Whether a module's hooks are its dropit layer's two and no others (none reads or replaces
    its input, output or gradients)."""
    return (len(module._forward_pre_hooks) == 1 and len(module._forward_hooks) == 1
            and not module._backward_hooks and not getattr(module, "_backward_pre_hooks", None))


def _fusing_relu():
    """The nn.ReLU that is to take this MaxPool2d's output, and nothing else, when the pooling may
    apply it (to_dropit's ``fuse_pool_relu``), else None. Inside a "pool" scope whose module an
    nn.Sequential's own forward called, the next module of that Sequential is a dropit-hooked
    nn.ReLU: Sequential's forward hands it the output and nothing else does, as long as no hook
    of either module, nor a global module hook, can read or replace the output on the way. The
    ReLU then returns its input (`_absorbs`); if anything else reached it first, it runs as it
    is, and relu(relu(y)) is relu(y)."""
    stack = _stack()
    top = stack[-1] if stack else None
    if top is None or not top.layer.fuse or top.frame is None:
        return None
    caller = top.frame.f_back  # the frame that called the pooling module
    if caller is None or caller.f_code is not _SEQUENTIAL_FORWARD:
        return None
    frame_locals = caller.f_locals
    sequential = frame_locals.get("self")
    if type(frame_locals) is dict:
        # Before Python 3.13 this is a snapshot the frame keeps, with a reference to each local
        # (the pooling's input among them) until it ends or the next snapshot: let them go.
        # Whoever writes a snapshot back into the frame (a tracer) takes a fresh one first.
        frame_locals.clear()
    if not isinstance(sequential, nn.Sequential):
        return None
    modules = list(sequential._modules.values())
    at = [i for i, m in enumerate(modules) if m is top.module]
    if len(at) != 1 or at[0] + 1 >= len(modules):
        return None
    relu = modules[at[0] + 1]
    if not (isinstance(relu, nn.ReLU) and _only_dropit_hooks(relu)
            and _only_dropit_hooks(top.module)):
        return None
    hook = next(iter(relu._forward_pre_hooks.values()))
    if not (isinstance(hook, _PreHook) and hook.layer.kind == "relu"):
        return None
    if (_MODULE_GLOBALS._global_forward_pre_hooks or _MODULE_GLOBALS._global_forward_hooks
            or _MODULE_GLOBALS._global_backward_hooks):
        return None
    return relu


def _absorbs(x):
    """Whether the ReLU running now takes the output of the pooling that applied it already
    (`_fusing_relu`): the same tensor, unchanged since, in the scope of the ReLU it named."""
    fused = getattr(_local, "fused", None)
    if fused is None:
        return False
    _local.fused = None
    output, version, relu = fused
    stack = _stack()
    return (output() is x and x._version == version and bool(stack)
            and stack[-1].module is relu())


def _on_stack(frame):
    f = sys._getframe(1)
    while f is not None:
        if f is frame:
            return True
        f = f.f_back
    return False


def _in_order(module, layer):
    """Whether the layer's scope may open now: its pre-hook is the module's last (a user's pre-hook
    registered after to_dropit runs outside the scope: its ops are none of the layer's, and what
    they save must stay exact). Else it becomes the last, from the next call on, and this call
    runs as PyTorch runs it. Its forward hook, which closes the scope, is made the first, before
    any user forward hook (whose ops read the input or output as they are)."""
    pre, post = layer.hook_ids
    pres, posts = module._forward_pre_hooks, module._forward_hooks
    if next(iter(posts), post) != post:
        posts.move_to_end(post, last=False)
    if next(reversed(pres), pre) != pre:
        pres.move_to_end(pre)
        return False
    return True


# PyTorch's global forward hooks (`register_module_forward_hook`) run before every module's own,
# so before a layer's forward hook closes its scope. While any exists, `_global_close` is the
# first of them and closes the scope in its place (`_global_order`).
_GLOBAL_FORWARD_HOOKS = getattr(torch.nn.modules.module, "_global_forward_hooks", None)
_global_lock = threading.Lock()
_global_closer = None  # the RemovableHandle of `_global_close` while it is registered


def _global_close(module, args, output):
    """A global forward hook: closes the scope of the layer `module` whose forward just returned,
    before a user's global forward hooks run (their ops read its input and output as they are)."""
    stack = _stack()
    if stack:
        top = stack[-1]
        if top.frame is sys._getframe(1) and top.module is module:
            _close(stack.pop())
    return None


def _global_order():
    """Keeps `_global_close` the first global forward hook while a user's exists, and removes it
    when it is the only one (a global hook costs every module its hook-free fast path)."""
    global _global_closer
    hooks = _GLOBAL_FORWARD_HOOKS
    if not hooks:
        return
    closer = _global_closer
    if closer is not None and len(hooks) > 1 and next(iter(hooks)) == closer.id:
        return
    with _global_lock:
        closer = _global_closer
        if closer is None or closer.id not in hooks:
            closer = _global_closer = torch.nn.modules.module.register_module_forward_hook(
                _global_close)
        if len(hooks) == 1:
            closer.remove()
            _global_closer = None
        elif next(iter(hooks)) != closer.id:
            hooks.move_to_end(closer.id, last=False)


class _LayerHook:
    """One of a layer's two module hooks. Objects, not closures, so that a hooked model pickles
    (torch.save(model)) and deep-copies with its hooks, as PyTorch copies every module hook: the
    copy gets its own `_Layer`, shared by its two hooks."""

    __slots__ = ("layer",)

    def __init__(self, layer):
        self.layer = layer

    def __getstate__(self):
        return self.layer

    def __setstate__(self, layer):
        self.layer = layer


class _PreHook(_LayerHook):
    """A layer's forward pre-hook: opens its scope."""

    __slots__ = ()

    def __call__(self, module, args):
        layer = self.layer
        stack = _stack()
        if stack:
            _drop_stale(stack)
        if not (module.training and torch.is_grad_enabled()) or not _in_order(module, layer):
            return None
        _global_order()
        scope = _Scope(layer, module, sys._getframe(1), args[0] if args else None)
        if scope.hooks:
            _push_hooks(scope.pack, _unpack)
        # The mode is entered once per thread: an enclosing scope's entry serves the inner ones
        # (a second entry would run every call through the mode twice).
        if ((layer.kernels or scope.route or layer.custom)
                and not any(s.mode for s in stack)):
            _KERNEL_MODE.__enter__()
            scope.mode = True
        stack.append(scope)
        return None


def _close(scope):
    """Leaves what a scope entered: the kernel mode (pooling, ReLU), the saved-tensor hooks."""
    scope.frame = None  # the frame holds the forward's locals: let them go
    scope.module = None
    scope.memo = None
    if scope.mode:
        scope.mode = False
        _KERNEL_MODE.__exit__(None, None, None)
    if scope.hooks:
        _pop_hooks()


class _PostHook(_LayerHook):
    """A layer's forward hook: closes its scope."""

    __slots__ = ()

    def __call__(self, module, args, output):
        stack = _stack()
        caller = sys._getframe(1)
        if stack and stack[-1].layer is self.layer and stack[-1].frame is caller:
            _close(stack.pop())
        return None


def _is_conv1d(module):
    """GPT-2's Conv1D (transformers.pytorch_utils.Conv1D and subclasses): y = x W + b with W
    stored [nx, nf]."""
    return any(c.__name__ == "Conv1D" for c in type(module).__mro__) and hasattr(module, "nf")


_STORE_KINDS = frozenset(["layernorm", "gelu", "softmax", "dropout", "batchnorm", "activation",
                          "attention", "pass"])
_DROPOUTS = tuple(
    c for c in (nn.Dropout, getattr(nn, "Dropout1d", None), nn.Dropout2d, nn.Dropout3d) if c
)


def _is_attention(module):
    return isinstance(module, nn.MultiheadAttention) or type(module).__name__.endswith("Attention")


# Layers whose saved input feeds only their weight gradient: Linear and every convolution.
_WEIGHT_MODULES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d,
                   nn.ConvTranspose2d, nn.ConvTranspose3d)


# Average poolings: their backward reads only the input's sizes.
_AVG_POOLS = (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.AdaptiveAvgPool1d,
              nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d)


# The methods through which a torch.nn layer's forward runs its op (a convolution's forward calls
# _conv_forward): a subclass that overrides one computes its own forward.
_FORWARD_METHODS = ("forward", "_conv_forward")


def _stock_forward(module):
    """Whether a module's forward is a torch.nn class's own (no subclass or instance overrides it
    or the `_conv_forward` it calls): then what it saves, and for which op, is known."""
    if any(m in vars(module) for m in _FORWARD_METHODS):
        return False
    for cls in type(module).__mro__:
        if cls.__module__.startswith("torch.nn."):
            return True
        if any(m in vars(cls) for m in _FORWARD_METHODS):
            return False
    return False


def _kind(module, masks, store=frozenset()):
    if isinstance(module, _WEIGHT_MODULES) or _is_conv1d(module):
        return "weight"
    # The masks stand for what the layer's own op saves, read only by that op's backward: a
    # subclass's own forward may save the same tensors for other ops (a ReLU subclass computing
    # x * sigmoid(x)), so it gets no mask kind; its F.relu / F.max_pool2d calls still go to
    # dropit's kernels (a "functional" scope), whose backward is their own.
    stock = masks and _stock_forward(module)
    if stock and isinstance(module, nn.ReLU):
        return "relu"
    if stock and isinstance(module, nn.MaxPool2d):
        return "pool"
    if stock and isinstance(module, _AVG_POOLS):
        return "avgpool"
    if stock and isinstance(module, (nn.LeakyReLU, nn.Hardtanh)):
        return "mask"
    if not store:
        return None
    if "layernorm" in store and isinstance(module, nn.LayerNorm):
        return "layernorm"
    if "batchnorm" in store and isinstance(module, nn.modules.batchnorm._BatchNorm):
        return "batchnorm"
    if "activation" in store and (isinstance(module, _ACTIVATIONS)
                                  or _holds(module, _ACTIVATION_FUNCS)):
        return "activation"
    if "gelu" in store and (isinstance(module, nn.GELU) or _holds(module, _GELU_FUNCS)):
        return "gelu"
    if "softmax" in store and isinstance(module, nn.Softmax):
        return "softmax"
    if "dropout" in store and isinstance(module, _DROPOUTS):
        return "dropout"
    if ("softmax" in store or "matmul" in store) and _is_attention(module):
        return "attention"
    return None


def _store_classes(store):
    if isinstance(store, str):
        store = (store,)
    store = tuple(store)
    if "all" in store:  # "all" alone or among the classes: every class
        store = STORE_CLASSES + tuple(c for c in store if c != "all")
    unknown = [c for c in store if c not in STORE_CLASSES]
    if unknown:
        raise _C.Error(
            f"dropit: to_dropit: store names no class of tensors: {', '.join(map(repr, unknown))}"
            f" (choose from {', '.join(STORE_CLASSES)}, or 'all')"
        )
    return frozenset(store)


class Handle:
    """What ``to_dropit`` registered; ``remove()`` takes it all off again (also as a context
    manager: ``with dropit.to_dropit(model): ...``)."""

    def __init__(self, policy, layers, hooks):
        self.policy = policy
        self._layers = layers
        self._hooks = hooks

    @property
    def layers(self):
        """``[(name, kind), ...]`` of the hooked layers; kind is "weight", "relu", "pool", "mask"
        (LeakyReLU, ReLU6 / Hardtanh), "avgpool", "functional" (a module whose own forward calls
        F.relu or F.max_pool2d; with strategy "none" also a Linear / convolution subclass that
        does), "dense" (an excluded module inside one), or with ``store=``:
        "layernorm", "gelu", "softmax", "dropout", "batchnorm", "activation", "attention", "pass"
        (a layer left dense inside an attention module)."""
        return [(layer.name, layer.kind) for layer in self._layers]

    def remove(self):
        """Removes every hook this handle registered (idempotent). On the calling thread it also
        closes what a forward that raised left open (its saved-tensor hooks, the pooling or ReLU
        kernel mode), which the next hooked forward would otherwise close."""
        stack = _stack()
        if stack:
            _drop_stale(stack)
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._layers = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False

    def __len__(self):
        return len(self._layers)

    def __repr__(self):
        kinds = {}
        for layer in self._layers:
            kinds[layer.kind] = kinds.get(layer.kind, 0) + 1
        counts = ", ".join(f"{k}={v}" for k, v in sorted(kinds.items()))
        return f"dropit.Handle({self.policy!r}, {counts or 'no layers'})"


def to_dropit(model, strategy="mink", gamma=0.9, exclude=(), masks=True, seed=0, codec="exact",
              positions="smallest", store=(), store_codec="int8", layer_gamma=None,
              low_memory=False, fuse_pool_relu=True):
    """Makes ``model``'s layers save less for backward, without replacing any module: the inputs
    of Linear, GPT-2 Conv1D and convolution layers and of nn.MultiheadAttention's projections
    through the policy, ReLU and MaxPool2d as masks, and the ``store`` classes through
    ``store_codec``.

    Args:
        model: an ``nn.Module``.
        strategy: ``"mink"`` (the (1 - gamma) largest magnitudes), ``"random"`` (random positions,
            new ones per layer and step, reproducible from ``seed``), ``"identity"`` (dense copy)
            or ``"none"`` (Linear/Conv save as PyTorch does; masks still apply).
        gamma: the fraction dropped, in [0, 1].
        exclude: module names, as in ``model.named_modules()``, left as PyTorch runs them (with
            everything under them), e.g. the first layer and the classifier head.
        masks: ReLU saves a 1-bit mask, MaxPool2d its window positions, LeakyReLU and ReLU6 /
            Hardtanh (with 0 outside its range) a 1-bit mask, average poolings their input's
            shape (all exact); so do the F.relu / torch.relu / Tensor.relu(_) and
            F.max_pool2d calls that a module makes in its own forward (a tutorial CNN's,
            nn.TransformerEncoderLayer's activation), outside excluded modules.
        seed: base seed of ``"random"``.
        codec: how the kept values are stored: ``"exact"``, or 8 bits with a scale per 1024
            values, ``"int8"`` (round to nearest) or ``"fp8"`` (e4m3); see the C++ codec.hpp.
        positions: how the kept positions are stored: ``"smallest"`` (bitmask, Elias-Fano code
            or index list, whichever is smallest: the C++ format.hpp) or ``"no_elias_fano"`` (a
            faster pack and restore, more bytes at high gamma).
        store: classes of the tensors DropIT leaves dense to keep through ``store_codec``:
            any of ``"layernorm"``, ``"gelu"``, ``"softmax"``, ``"matmul"`` (attention modules'
            matmul inputs), ``"dropout"`` (1 bit per element, exact), ``"batchnorm"`` (BatchNorm
            inputs), ``"activation"`` (SiLU, Tanh, ...: what they save), or ``"all"`` (alone or
            in the sequence). See the module's docstring for which module saves which.
        store_codec: ``"int8"``, ``"fp8"`` or ``"exact"`` (a dense copy: gradients as PyTorch's).
        layer_gamma: ``{name: gamma}``: a Linear/Conv layer takes the gamma of the longest name
            that is its own or a dotted prefix of it (``""`` matches all), else ``gamma``.
        low_memory: Conv2d layers also run dropit's C++ convolution (as Linear and Conv1D layers
            run its matmul), which runs forward and backward in pieces of samples so that no
            whole rebuilt input exists: a lower peak for a slower step (docs/python.md).
        fuse_pool_relu: with ``masks``, where an nn.Sequential runs a MaxPool2d and then an
            nn.ReLU (both hooked, neither with other hooks), the pooling applies the ReLU and
            keeps window positions only for the outputs the ReLU passes, and the ReLU returns its
            input: the same outputs and gradients, fewer bytes saved. Its backward is not
            differentiable: set it False for double backward (``create_graph=True``).

    Returns:
        a ``Handle``; ``handle.remove()`` undoes it.

    Raises:
        dropit.Error: bad strategy, gamma, codec, positions, store class or store codec, an
        excluded name that is no module of the model, or a model already converted. Nothing is
        registered then.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"dropit: to_dropit: model must be an nn.Module, got {type(model).__name__}")
    # checks strategy, gamma, codec and positions
    policy = _C.Policy(str(strategy), float(gamma), int(seed), str(codec), str(positions))
    store = _store_classes(store)
    store_policy = _C.Policy("identity", 0.0, 0, str(store_codec))  # checks the codec
    if isinstance(exclude, str):
        exclude = (exclude,)
    exclude = tuple(exclude)
    named = list(model.named_modules())
    names = {name for name, _ in named}
    unknown = [e for e in exclude if e not in names]
    if unknown:
        raise _C.Error(
            f"dropit: to_dropit: exclude names no module of the model: {', '.join(map(repr, unknown))}"
            " (use the names of model.named_modules(), e.g. '0' or 'features.0')"
        )

    def excluded(name):
        return any(name == e or name.startswith(e + ".") or e == "" for e in exclude)

    layer_gamma = dict(layer_gamma or {})
    unknown = [k for k in layer_gamma if k not in names]
    if unknown:
        raise _C.Error(
            f"dropit: to_dropit: layer_gamma names no module of the model: "
            f"{', '.join(map(repr, unknown))} (use the names of model.named_modules())"
        )
    # One policy per distinct gamma (checks each gamma).
    layer_policies = {
        k: _C.Policy(policy.kind, float(g), policy.seed, policy.codec, policy.positions)
        for k, g in layer_gamma.items()
    } if policy.kind in ("mink", "random") else {}

    def policy_of(name):
        best = None
        for key in layer_policies:
            if (key == "" or name == key or name.startswith(key + ".")) and (
                    best is None or len(key) > len(best)):
                best = key
        return policy if best is None else layer_policies[best]

    selected, attention, projecting, functional = [], [], set(), []

    def under(name, parents):
        return any(a == "" or name.startswith(a + ".") for a in parents)

    def under_attention(name):
        return under(name, attention)

    def child(name, attr):
        return f"{name}.{attr}" if name else attr

    for name, module in named:
        kind = _kind(module, masks, store)
        if kind is None and policy.kind != "none" and isinstance(module, nn.MultiheadAttention):
            kind = "attention"  # its projections, which its functional forward runs
        calls = (kind in (None, "weight") and masks and not excluded(name)
                 and not under_attention(name) and _calls_functional(module))
        if calls and (kind is None or policy.kind == "none"):
            kind = "functional"  # its own F.relu / F.max_pool2d calls (Linear/Conv: no policy)
        parent = name.rpartition(".")[0]
        # The outermost excluded module inside a "functional" one (not in an attention module,
        # where "pass" does it): its scope stops the routing of F.relu / F.max_pool2d calls, as
        # it is left as PyTorch runs it.
        blocks = (excluded(name) and not excluded(parent) and under(name, functional)
                  and not under_attention(name))
        if kind is None and not blocks:
            continue
        if parent in projecting and name == child(parent, "out_proj"):
            continue  # never called: its parent routes the F.linear that stands for it
        if kind == "functional" or calls:  # a Linear / convolution subclass may call them too
            functional.append(name)
        elif blocks:
            kind = "dense"
        elif excluded(name) or (kind == "weight" and policy.kind == "none"):
            # Left as PyTorch runs it; inside an attention module that packs its saved tensors,
            # that takes a scope that packs nothing.
            if not under_attention(name):
                continue
            kind = "pass"
        if kind == "attention":
            attention.append(name)
            if policy.kind != "none" and isinstance(module, nn.MultiheadAttention):
                projecting.add(name)
        if _has_dropit_hooks(module):
            raise _C.Error(
                f"dropit: to_dropit: module '{name}' already has dropit hooks (call remove() on "
                "the earlier handle first, or dropit.remove_hooks(model) on a copy of a hooked "
                "model)"
            )
        selected.append((name, module, kind))

    layers, hooks = [], []
    handle = Handle(policy, layers, hooks)
    try:
        for index, (name, module, kind) in enumerate(selected):
            if kind in _STORE_KINDS:
                layer = _Layer(name, kind, store_policy, index, module, store)
                if name in projecting:
                    out = child(name, "out_proj")
                    layer.set_projections({"in": policy_of(name),
                                           "out": None if excluded(out) else policy_of(out)})
            else:
                layer = _Layer(name, kind, policy_of(name) if kind == "weight" else policy, index,
                               module, low_memory=bool(low_memory),
                               functional=kind == "weight" and name in functional,
                               fuse=bool(fuse_pool_relu))
            pre = module.register_forward_pre_hook(_PreHook(layer))
            hooks.append(pre)
            post = module.register_forward_hook(_PostHook(layer))
            hooks.append(post)
            layer.hook_ids = (pre.id, post.id)
            module._forward_hooks.move_to_end(post.id, last=False)  # before the user's hooks
            layers.append(layer)
    except BaseException:
        handle.remove()
        raise
    return handle


def _has_dropit_hooks(module):
    return any(isinstance(h, _LayerHook) for hooks in (module._forward_pre_hooks,
                                                     module._forward_hooks)
               for h in hooks.values())


def remove_hooks(model):
    """Takes every dropit hook off ``model`` and its submodules, whichever ``to_dropit``
    registered it or however it came: a ``copy.deepcopy`` of a hooked model and one that
    ``torch.save`` / ``torch.load`` (pickle) brought back keep their hooks, as PyTorch keeps every
    module hook, and have no ``Handle``. Returns how many modules had them."""
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"dropit: remove_hooks: model must be an nn.Module, got {type(model).__name__}")
    stack = _stack()
    if stack:
        _drop_stale(stack)
    count = 0
    for module in model.modules():
        if not _has_dropit_hooks(module):
            continue
        count += 1
        for hooks in (module._forward_pre_hooks, module._forward_hooks):
            for key in [k for k, h in hooks.items() if isinstance(h, _LayerHook)]:
                del hooks[key]
    return count


def _pack_any(policy, t):
    if not t.is_floating_point() or _is_parameter_like(t):
        return _detached(t)
    return _C._pack_saved(t, policy)


class saved_tensors(torch.autograd.graph.saved_tensors_hooks):
    """Packs every floating-point tensor the code in the block saves for backward (parameters,
    their views and autograd copies excepted) with ``policy``:

        with dropit.saved_tensors(dropit.MinK(0.9)):
            y = layer(x)

    Unlike ``to_dropit``, nothing tells the tensors apart: use it around code whose saved
    activations feed only weight gradients (a Linear or Conv), or with ``dropit.Identity()``.
    """

    def __init__(self, policy):
        if not isinstance(policy, _C.Policy):
            raise TypeError(
                f"dropit: saved_tensors: a dropit policy is needed (dropit.MinK(0.9), ...), got "
                f"{type(policy).__name__}"
            )
        self.policy = policy
        super().__init__(lambda t: _pack_any(policy, t), _unpack)
