import ctypes
import math
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))


def keep_freed_memory():
    """Tells glibc's malloc to keep the memory torch frees for torch's next tensors, as
    TensorFlow's allocator does and PyTorch's CPU tuning guide advises (jemalloc, tcmalloc). By
    default glibc hands every freed block above 32 MiB back to the system, so each call faults
    the pages of its large activations in again: keras.io's time-series Transformer at
    [64, 136, 4] takes 296 ms a forward pass that way against 217 ms (2 threads, Intel Xeon).
    The process keeps its peak memory until it exits. Returns False, changing nothing, where the
    C library is not glibc."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
            return False
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError, ValueError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # <malloc.h>
    # A glibc that caps the threshold at 32 MiB refuses 1 GiB: no block is mmapped there instead.
    kept = mallopt(M_MMAP_THRESHOLD, 1 << 30) or mallopt(M_MMAP_MAX, 0)
    return bool(kept and mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


# ---------------------------------------------------------------------------------------------
# Keras semantics that torch has no built-in for, written out once (keras 3.15, TensorFlow).
# ---------------------------------------------------------------------------------------------


def softplus(x):
    """keras.activations.softplus: relu(x) + log1p(exp(-|x|)), the stable form TensorFlow's
    kernel follows (F.softplus returns x itself above its threshold of 20)."""
    return F.relu(x) + torch.log1p(torch.exp(-x.abs()))


def hard_sigmoid(x):
    """keras.activations.hard_sigmoid: relu6(x + 3) / 6, in Keras' order of operations."""
    return F.relu6(x + 3.0) / 6.0


def hard_silu(x):
    """keras.activations.hard_silu: x * hard_sigmoid(x) (F.hardswish divides the product instead)."""
    return x * hard_sigmoid(x)


def mish(x):
    """keras.activations.mish: x * tanh(softplus(x)), with Keras' softplus."""
    return x * torch.tanh(softplus(x))


# Keras' activations by name, for the classes below that take `activation="..."`; `forward`
# calls each as written here (the torch function itself wherever it computes what Keras does).
ACTIVATIONS = {
    "linear": lambda x: x,
    "relu": F.relu,
    "gelu": lambda x: F.gelu(x, approximate="none"),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "softmax": lambda x: F.softmax(x, dim=-1),
    "log_softmax": lambda x: F.log_softmax(x, dim=-1),
    "elu": F.elu,
    "selu": F.selu,
    "softplus": softplus,
    "softsign": F.softsign,
    "hard_sigmoid": hard_sigmoid,
    "hard_silu": hard_silu,
    "leaky_relu": lambda x: F.leaky_relu(x, negative_slope=0.2),
    "relu6": F.relu6,
    "mish": mish,
    "exponential": torch.exp,
}


def keras_relu(x, max_value=None, negative_slope=0.0, threshold=0.0):
    """keras.layers.ReLU, step by step as Keras computes it (`forward` writes F.relu for the
    defaults and F.leaky_relu for a negative slope alone, the first steps here)."""
    if negative_slope != 0.0 and max_value is None and threshold == 0.0:
        return F.leaky_relu(x, negative_slope)
    negative = F.relu(-x + threshold) if negative_slope != 0.0 else None
    y = torch.where(x > threshold, x, torch.zeros_like(x)) if threshold != 0.0 else F.relu(x)
    if max_value is not None:
        y = torch.clamp(y, 0.0, max_value)
    if negative is not None:
        y = y - negative_slope * negative
    return y


def keras_elu(x, alpha=1.0):
    """keras.layers.ELU: exp(x) - 1 as Keras' layer computes it (F.elu uses expm1)."""
    return torch.where(x > 0, x, alpha * (torch.exp(x) - 1.0))


def keras_softmax(x, axis=(-1,), mask=None):
    """keras.layers.Softmax over the axes `axis` (a list): masked positions (mask False, or not
    above 0.5) get -1e9 first and 0 after, so a fully masked row attends to nothing (`forward`
    writes F.softmax for one axis without a mask)."""
    if mask is not None:
        mask = mask > 0.5 if mask.dtype != torch.bool else mask
        x = torch.where(mask, x, torch.full_like(x, -1e9))
    if len(axis) == 1:
        y = torch.softmax(x, dim=axis[0])
    else:
        y = torch.exp(x - torch.logsumexp(x, dim=axis, keepdim=True))
    return y if mask is None else torch.where(mask, y, torch.zeros_like(y))


def merge_masks(masks):
    """Merge layers: the OR of the inputs' masks when every input has one, else none."""
    if any(m is None for m in masks):
        return None
    out = masks[0]
    for m in masks[1:]:
        out = torch.logical_or(out, m)
    return out


def concatenate_masks(inputs, masks, axis=-1):
    """Concatenate: masks joined along `axis` (all-true for an unmasked input), any over the last axis."""
    if all(m is None for m in masks):
        return None
    full = []
    for x, m in zip(inputs, masks):
        if m is None:
            full.append(torch.ones_like(x, dtype=torch.bool))
        elif m.dim() < x.dim():
            full.append(torch.logical_or(m.unsqueeze(-1), torch.zeros_like(x, dtype=torch.bool)))
        else:
            full.append(m.bool())
    return torch.any(torch.cat(full, dim=axis), dim=-1)


def masking(x, mask_value=0.0):
    """keras.layers.Masking: steps whose features all equal mask_value become 0 and masked."""
    keep = torch.any(x != mask_value, dim=-1, keepdim=True)
    return x * keep.to(x.dtype), keep.squeeze(-1)


def same_padding(length, reach, stride):
    """TensorFlow's SAME: ceil(L / s) outputs, the smaller half of the padding first."""
    out = -(-length // stride)
    total = max((out - 1) * stride + reach - length, 0)
    return total // 2, total - total // 2


def pool1d(x, maximum, pool_size, strides, padding, channels_last):
    """max_pooling1d (`maximum`) or average_pooling1d; the padding ("same": TensorFlow's SAME)
    never counts."""
    if channels_last:
        x = x.transpose(1, 2)  # [B, C, L]
    left, right = same_padding(x.shape[-1], pool_size, strides) if padding == "same" else (0, 0)
    if maximum:
        y = F.max_pool1d(F.pad(x, (left, right), value=-math.inf), pool_size, strides)
    else:
        total = F.avg_pool1d(F.pad(x, (left, right)), pool_size, strides) * pool_size
        ones = F.pad(torch.ones_like(x[:1, :1]), (left, right))
        y = total / (F.avg_pool1d(ones, pool_size, strides) * pool_size)
    return y.transpose(1, 2) if channels_last else y


def max_pooling1d(x, pool_size, strides, padding="valid", channels_last=True):
    """keras.layers.MaxPooling1D."""
    return pool1d(x, True, pool_size, strides, padding, channels_last)


def average_pooling1d(x, pool_size, strides, padding="valid", channels_last=True):
    """keras.layers.AveragePooling1D: the mean of each window's steps inside the input."""
    return pool1d(x, False, pool_size, strides, padding, channels_last)


def pool2d(x, maximum, pool_size, strides, padding, channels_last):
    """max_pooling2d (`maximum`) or average_pooling2d; the padding ("same": TensorFlow's SAME)
    never counts."""
    if channels_last:
        x = x.permute(0, 3, 1, 2)  # [B, C, H, W]
    pad = same_padding_2d(x, pool_size, strides, (1, 1)) if padding == "same" else (0, 0, 0, 0)
    if maximum:
        y = F.max_pool2d(F.pad(x, pad, value=-math.inf), pool_size, strides)
    else:
        total = F.avg_pool2d(F.pad(x, pad), pool_size, strides, divisor_override=1)
        ones = F.pad(torch.ones_like(x[:1, :1]), pad)
        y = total / F.avg_pool2d(ones, pool_size, strides, divisor_override=1)
    return y.permute(0, 2, 3, 1) if channels_last else y


def max_pooling2d(x, pool_size, strides, padding="valid", channels_last=True):
    """keras.layers.MaxPooling2D."""
    return pool2d(x, True, pool_size, strides, padding, channels_last)


def average_pooling2d(x, pool_size, strides, padding="valid", channels_last=True):
    """keras.layers.AveragePooling2D: the mean of each window's pixels inside the input."""
    return pool2d(x, False, pool_size, strides, padding, channels_last)


def aspect_crop(rows, columns, height, width):
    """Keras' crop_to_aspect_ratio window: (start, size) along the rows, then the columns."""
    crop_rows = max(min(int(float(columns * height) / width), rows), 1)
    crop_columns = max(min(int(float(rows * width) / height), columns), 1)
    return (int((rows - crop_rows) / 2), crop_rows), (int((columns - crop_columns) / 2), crop_columns)


def resize_bilinear(x, size):
    """tf.image.resize(method="bilinear") on [B, C, H, W]: half-pixel centres, float32 positions,
    `a + (b - a) * t` with the width first, as TensorFlow computes it (F.interpolate weighs the
    two pixels instead, which rounds differently on 0-255 images)."""
    for axis, out in ((3, size[1]), (2, size[0])):
        length = x.shape[axis]
        scale = torch.tensor(float(length), dtype=torch.float32) / out
        position = (torch.arange(out, dtype=torch.float32) + 0.5) * scale - 0.5
        floor = torch.floor(position)
        lower = torch.clamp(floor, min=0).long().clamp(max=length - 1)
        upper = torch.clamp(torch.ceil(position), min=0).long().clamp(max=length - 1)
        t = (position - floor).reshape([-1 if a == axis else 1 for a in range(4)])
        a, b = x.index_select(axis, lower), x.index_select(axis, upper)
        x = a + (b - a) * t
    return x


def resize_nearest(x, size):
    """tf.image.resize(method="nearest") on [B, C, H, W]: half-pixel centres, floor."""
    for axis, out in ((2, size[0]), (3, size[1])):
        length = x.shape[axis]
        scale = torch.tensor(float(length), dtype=torch.float32) / out
        source = torch.clamp(torch.floor((torch.arange(out, dtype=torch.float32) + 0.5) * scale).long(), max=length - 1)
        x = x.index_select(axis, source)
    return x


def resize(x, height, width, interpolation="bilinear", crop_to_aspect_ratio=False, channels_last=True):
    """keras.layers.Resizing to height x width as TensorFlow resizes (no antialiasing);
    interpolation "bilinear" or "nearest"."""
    size = (height, width)
    if channels_last:
        x = x.permute(0, 3, 1, 2)
    if crop_to_aspect_ratio:
        (top, rows), (left, columns) = aspect_crop(x.shape[2], x.shape[3], *size)
        x = x[:, :, top:top + rows, left:left + columns]
    x = resize_bilinear(x, size) if interpolation == "bilinear" else resize_nearest(x, size)
    return x.permute(0, 2, 3, 1) if channels_last else x


def center_crop(x, height, width, channels_last=True):
    """keras.layers.CenterCrop: the centred height x width window, or Keras' smart_resize for a
    smaller image."""
    rows, columns = (x.shape[1], x.shape[2]) if channels_last else (x.shape[2], x.shape[3])
    if rows >= height and columns >= width:
        top, left = (rows - height) // 2, (columns - width) // 2
        if channels_last:
            return x[:, top:top + height, left:left + width, :]
        return x[:, :, top:top + height, left:left + width]
    return resize(x, height, width, interpolation="bilinear", crop_to_aspect_ratio=True, channels_last=channels_last)


def extract_patches(x, size, strides, dilation_rate=1, padding="valid", channels_last=True):
    """keras.ops.image.extract_patches: each window as one vector in (row, column, channel) order."""
    if not channels_last:
        x = x.permute(0, 2, 3, 1)
    reach = [(size[a] - 1) * dilation_rate + 1 for a in range(2)]
    if padding == "same":
        (top, bottom), (left, right) = (same_padding(x.shape[1 + a], reach[a], strides[a]) for a in range(2))
        x = F.pad(x, (0, 0, left, right, top, bottom))
    counts = [(x.shape[1 + a] - reach[a]) // strides[a] + 1 for a in range(2)]
    parts = [
        x[:, i * dilation_rate : i * dilation_rate + (counts[0] - 1) * strides[0] + 1 : strides[0],
          j * dilation_rate : j * dilation_rate + (counts[1] - 1) * strides[1] + 1 : strides[1], :]
        for i in range(size[0])
        for j in range(size[1])
    ]
    patches = torch.cat(parts, dim=-1)
    return patches if channels_last else patches.permute(0, 3, 1, 2)


def global_average_pooling1d(x, mask=None, keepdims=False, channels_last=True):
    """keras.layers.GlobalAveragePooling1D: the mean over the unmasked steps (`forward` writes
    torch.mean where the call has no mask)."""
    steps = 1 if channels_last else 2
    if mask is None:
        return x.mean(dim=steps, keepdim=keepdims)
    m = mask.unsqueeze(2 if channels_last else 1).to(x.dtype)
    return (x * m).sum(dim=steps, keepdim=keepdims) / m.sum(dim=steps, keepdim=keepdims)


def reduce(x, kind, axis=None, keepdims=False):
    """keras.ops.mean / sum / max / min / prod / any / all (`kind`) over the axes `axis` (a
    list; None: every axis)."""
    axes = tuple(range(x.dim())) if axis is None else tuple(a % x.dim() for a in axis)
    if kind == "prod":
        for a in sorted(axes, reverse=True):
            x = torch.prod(x, dim=a, keepdim=keepdims)
        return x
    functions = {"mean": torch.mean, "sum": torch.sum, "max": torch.amax, "min": torch.amin, "any": torch.any, "all": torch.all}
    return functions[kind](x, dim=axes, keepdim=keepdims)


def expand_dims(x, axis):
    """keras.ops.expand_dims with several new axes (`axis`, a list; `forward` writes
    unsqueeze for one)."""
    rank = x.dim() + len(axis)
    for a in sorted(a % rank for a in axis):
        x = x.unsqueeze(a)
    return x


class Conv1D(torch.nn.Module):
    """keras.layers.Conv1D: nn.Conv1d with TensorFlow's padding ("valid", "same" or "causal"),
    Keras' channels-last layout (channels_last=False: data_format="channels_first") and its
    activation by name."""

    def __init__(self, in_channels, filters, kernel_size, strides=1, dilation_rate=1, groups=1, use_bias=True,
                 padding="valid", channels_last=True, activation="linear"):
        super().__init__()
        self.conv = torch.nn.Conv1d(
            in_channels, filters, kernel_size, stride=strides, dilation=dilation_rate, groups=groups, bias=use_bias
        )
        self.padding, self.channels_last, self.activation = padding, channels_last, activation

    def forward(self, x):
        if self.channels_last:
            x = x.transpose(1, 2)  # [B, L, C] -> [B, C, L]
        reach = (self.conv.kernel_size[0] - 1) * self.conv.dilation[0] + 1
        if self.padding == "same":
            x = F.pad(x, same_padding(x.shape[-1], reach, self.conv.stride[0]))
        elif self.padding == "causal":
            x = F.pad(x, (reach - 1, 0))
        y = self.conv(x)
        y = y.transpose(1, 2) if self.channels_last else y
        return ACTIVATIONS[self.activation](y)


def same_padding_2d(x, kernel, stride, dilation):
    """F.pad's amounts for TensorFlow's SAME on [B, C, H, W]: the width's pair first."""
    (top, bottom), (left, right) = (
        same_padding(x.shape[2 + a], (kernel[a] - 1) * dilation[a] + 1, stride[a]) for a in range(2)
    )
    return left, right, top, bottom


class Conv2D(torch.nn.Module):
    """keras.layers.Conv2D and DepthwiseConv2D (groups = in_channels, filters = in_channels *
    depth_multiplier): nn.Conv2d with TensorFlow's padding ("valid" or "same"), Keras'
    channels-last layout and its activation by name; DepthwiseConv1D with one_dimensional."""

    def __init__(self, in_channels, filters, kernel_size, strides=(1, 1), dilation_rate=(1, 1), groups=1, use_bias=True,
                 padding="valid", channels_last=True, activation="linear", one_dimensional=False):
        super().__init__()
        self.conv = torch.nn.Conv2d(
            in_channels, filters, kernel_size, stride=strides, dilation=dilation_rate, groups=groups, bias=use_bias
        )
        self.same, self.channels_last, self.activation = padding == "same", channels_last, activation
        self.one_dimensional = one_dimensional  # DepthwiseConv1D: [B, L, C] as a height of 1

    def forward(self, x):
        if self.one_dimensional:
            x = x.unsqueeze(1 if self.channels_last else 2)
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)  # [B, H, W, C] -> [B, C, H, W]
        if self.same:
            x = F.pad(x, same_padding_2d(x, self.conv.kernel_size, self.conv.stride, self.conv.dilation))
        y = self.conv(x)
        y = y.permute(0, 2, 3, 1) if self.channels_last else y
        if self.one_dimensional:
            y = y.squeeze(1 if self.channels_last else 2)
        return ACTIVATIONS[self.activation](y)


class ConvTranspose(torch.nn.Module):
    """keras.layers.Conv1DTranspose (one_dimensional) / Conv2DTranspose: the full
    nn.ConvTranspose2d, cut to Keras' output length from TensorFlow's padding start ("valid" or
    "same"), then the bias and the activation."""

    def __init__(self, in_channels, filters, kernel_size, strides=(1, 1), dilation_rate=(1, 1), use_bias=True,
                 padding="valid", output_padding=None, channels_last=True, activation="linear", one_dimensional=False):
        super().__init__()
        self.conv = torch.nn.ConvTranspose2d(
            in_channels, filters, kernel_size, stride=strides, dilation=dilation_rate, bias=False
        )
        self.bias = torch.nn.Parameter(torch.zeros(filters)) if use_bias else None
        self.same, self.output_padding, self.activation = padding == "same", output_padding, activation
        self.channels_last, self.one_dimensional = channels_last, one_dimensional

    def cut(self, axis, length):
        stride, reach = self.conv.stride[axis], (self.conv.kernel_size[axis] - 1) * self.conv.dilation[axis] + 1
        if self.output_padding is None:
            size = length * stride if self.same else length * stride + max(reach - stride, 0)
        else:
            pad = reach // 2 if self.same else 0
            size = (length - 1) * stride + reach - 2 * pad + self.output_padding[axis]
        start = max((length - 1) * stride + reach - size, 0) // 2 if self.same else 0
        return start, size

    def forward(self, x):
        if self.one_dimensional:
            x = x.unsqueeze(1 if self.channels_last else 2)
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        lengths = x.shape[2], x.shape[3]
        y = self.conv(x)
        for axis, length in enumerate(lengths):
            start, size = self.cut(axis, length)
            y = y.narrow(2 + axis, start, min(size, y.shape[2 + axis] - start))
            missing = start + size - (y.shape[2 + axis] + start)
            if missing > 0:
                y = F.pad(y, (0, missing, 0, 0) if axis == 1 else (0, 0, 0, missing))
        if self.bias is not None:
            y = y + self.bias[:, None, None]
        if self.channels_last:
            y = y.permute(0, 2, 3, 1)
        if self.one_dimensional:
            y = y.squeeze(1 if self.channels_last else 2)
        return ACTIVATIONS[self.activation](y)


class SeparableConv2D(torch.nn.Module):
    """keras.layers.SeparableConv2D (SeparableConv1D with one_dimensional): a depthwise nn.Conv2d
    (no bias), then a 1x1 one with the bias; TensorFlow's padding ("valid" or "same")."""

    def __init__(self, in_channels, filters, kernel_size, depth_multiplier=1, strides=(1, 1), dilation_rate=(1, 1),
                 use_bias=True, padding="valid", channels_last=True, activation="linear", one_dimensional=False):
        super().__init__()
        inner = in_channels * depth_multiplier
        self.depthwise = torch.nn.Conv2d(
            in_channels, inner, kernel_size, stride=strides, dilation=dilation_rate, groups=in_channels, bias=False
        )
        self.pointwise = torch.nn.Conv2d(inner, filters, 1, bias=use_bias)
        self.same, self.channels_last, self.activation = padding == "same", channels_last, activation
        self.one_dimensional = one_dimensional  # SeparableConv1D: [B, L, C] as a height of 1

    def forward(self, x):
        if self.one_dimensional:
            x = x.unsqueeze(1 if self.channels_last else 2)
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        if self.same:
            x = F.pad(x, same_padding_2d(x, self.depthwise.kernel_size, self.depthwise.stride, self.depthwise.dilation))
        y = self.pointwise(self.depthwise(x))
        y = y.permute(0, 2, 3, 1) if self.channels_last else y
        if self.one_dimensional:
            y = y.squeeze(1 if self.channels_last else 2)
        return ACTIVATIONS[self.activation](y)


class ReversibleEmbedding(torch.nn.Embedding):
    """keras.layers.ReversibleEmbedding: an embedding whose reverse=True call gives logits over
    the vocabulary, x @ weight.T (tied) or x @ reverse_weight, as tanh(logits / cap) * cap where
    logit_soft_cap is given."""

    def __init__(self, num_embeddings, embedding_dim, tie_weights=True, logit_soft_cap=None):
        super().__init__(num_embeddings, embedding_dim)
        self.logit_soft_cap = logit_soft_cap
        self.reverse_weight = None if tie_weights else torch.nn.Parameter(torch.zeros(embedding_dim, num_embeddings))

    def forward(self, x, reverse=False):
        if not reverse:
            return super().forward(x.long())
        logits = x @ (self.weight.T if self.reverse_weight is None else self.reverse_weight)
        if self.logit_soft_cap is not None:
            logits = torch.tanh(logits / self.logit_soft_cap) * self.logit_soft_cap
        return logits


class EinsumDense(torch.nn.Module):
    """keras.layers.EinsumDense: einsum(equation, x, kernel) + bias (none where bias_shape is
    None), then the activation by name."""

    def __init__(self, equation, kernel_shape, bias_shape=None, activation="linear"):
        super().__init__()
        self.equation, self.activation = equation, activation
        self.kernel = torch.nn.Parameter(torch.zeros(kernel_shape))
        self.bias = torch.nn.Parameter(torch.zeros(bias_shape)) if bias_shape is not None else None

    def forward(self, x):
        y = torch.einsum(self.equation, x, self.kernel)
        if self.bias is not None:
            y = y + self.bias
        return ACTIVATIONS[self.activation](y)


def normalize(x, mean, variance, epsilon, gamma, beta, shape):
    """Keras' order of operations: inv = rsqrt(var + eps) * gamma; x * inv + (beta - mean * inv)."""
    inv = torch.rsqrt(variance + epsilon)
    if gamma is not None:
        inv = inv * gamma.reshape(shape)
    offset = -mean * inv
    if beta is not None:
        offset = offset + beta.reshape(shape)
    return x * inv + offset


class LayerNormalization(torch.nn.Module):
    """keras.layers.LayerNormalization over the axes `axis` (a list), as Keras orders the
    operations; gamma and beta of param_shape (the normalised axes' sizes, flattened)."""

    def __init__(self, param_shape, axis=(-1,), epsilon=0.001, center=True, scale=True, rms_scaling=False):
        super().__init__()
        self.axes, self.epsilon, self.rms_scaling = axis, epsilon, rms_scaling
        self.gamma = torch.nn.Parameter(torch.ones(param_shape)) if scale or rms_scaling else None
        self.beta = torch.nn.Parameter(torch.zeros(param_shape)) if center and not rms_scaling else None

    def forward(self, x):
        axes = sorted(a % x.dim() for a in self.axes)
        shape = [x.shape[i] if i in axes else 1 for i in range(x.dim())]
        variance, mean = torch.var_mean(x, dim=axes, keepdim=True, correction=0)
        if self.rms_scaling:  # Keras' deprecated rms_scaling: x * rsqrt(var + eps) * gamma
            return x * torch.rsqrt(variance + self.epsilon) * self.gamma.reshape(shape)
        return normalize(x, mean, variance, self.epsilon, self.gamma, self.beta, shape)


class BatchNormalization(torch.nn.Module):
    """keras.layers.BatchNormalization on any axis: moving statistics in eval, the batch's in training
    (weighted by the mask, and updating the moving statistics with Keras' momentum); `channels`
    is the size of `axis`."""

    def __init__(self, channels, axis=-1, epsilon=0.001, momentum=0.99, center=True, scale=True):
        super().__init__()
        self.axis, self.epsilon, self.momentum = axis, epsilon, momentum
        self.gamma = torch.nn.Parameter(torch.ones(channels)) if scale else None
        self.beta = torch.nn.Parameter(torch.zeros(channels)) if center else None
        self.register_buffer("moving_mean", torch.zeros(channels))
        self.register_buffer("moving_variance", torch.ones(channels))

    def forward(self, x, mask=None):
        axis = self.axis % x.dim()
        shape = [x.shape[i] if i == axis else 1 for i in range(x.dim())]
        if self.training:
            dims = [i for i in range(x.dim()) if i != axis]
            w = torch.ones_like(x) if mask is None else mask.unsqueeze(-1).to(x.dtype).expand_as(x)
            mean = (x * w).sum(dim=dims, keepdim=True) / w.sum(dim=dims, keepdim=True)
            variance = ((x - mean) ** 2 * w).sum(dim=dims, keepdim=True) / w.sum(dim=dims, keepdim=True)
            with torch.no_grad():
                self.moving_mean.mul_(self.momentum).add_((1 - self.momentum) * mean.reshape(-1))
                self.moving_variance.mul_(self.momentum).add_((1 - self.momentum) * variance.reshape(-1))
        else:
            mean, variance = self.moving_mean.reshape(shape), self.moving_variance.reshape(shape)
        return normalize(x, mean, variance, self.epsilon, self.gamma, self.beta, shape)


class GroupNormalization(torch.nn.Module):
    """keras.layers.GroupNormalization: groups of channels of `axis` (-1 groups: one per
    channel; `channels` the size of `axis`), normalised over every other axis but the batch's,
    in Keras' order of operations."""

    def __init__(self, channels, groups=32, axis=-1, epsilon=0.001, center=True, scale=True):
        super().__init__()
        self.gamma = torch.nn.Parameter(torch.ones(channels)) if scale else None
        self.beta = torch.nn.Parameter(torch.zeros(channels)) if center else None
        self.groups, self.axis, self.epsilon = groups, axis, epsilon

    def forward(self, x):
        axis = self.axis % x.dim()
        channels = x.shape[axis]
        groups = channels if self.groups == -1 else self.groups
        grouped = list(x.shape[:axis]) + [groups, channels // groups] + list(x.shape[axis + 1:])
        xg = x.reshape(grouped)
        reduce = [a for a in range(1, x.dim() + 1) if a != axis]
        mean = xg.mean(dim=reduce, keepdim=True)
        variance = torch.square(xg - mean).mean(dim=reduce, keepdim=True)
        shape = [1] * (x.dim() + 1)
        shape[axis], shape[axis + 1] = groups, channels // groups
        inv = torch.rsqrt(variance + self.epsilon)
        if self.gamma is not None:
            inv = inv * self.gamma.reshape(shape)
        offset = -mean * inv
        if self.beta is not None:
            offset = offset + self.beta.reshape(shape)
        return (xg * inv + offset).reshape(x.shape)


class Normalization(torch.nn.Module):
    """keras.layers.Normalization: (x - mean) / max(sqrt(variance), 1e-7), or its inverse; the
    mean and variance of mean_and_var_shape, the sizes of the kept axes `axis` (a list)."""

    def __init__(self, mean_and_var_shape, axis=(-1,), invert=False):
        super().__init__()
        self.register_buffer("mean", torch.zeros(mean_and_var_shape))
        self.register_buffer("variance", torch.ones(mean_and_var_shape))
        self.axes, self.invert = axis, invert

    def forward(self, x):
        kept = sorted(a % x.dim() for a in self.axes)
        broadcast = [1] * x.dim()
        for size, axis in zip(reversed(self.mean.shape), reversed(kept)):
            broadcast[axis] = size
        mean = self.mean.reshape(broadcast)
        deviation = torch.clamp(torch.sqrt(self.variance.reshape(broadcast)), min=1e-7)
        return mean + x * deviation if self.invert else (x - mean) / deviation


class PReLU(torch.nn.Module):
    """keras.layers.PReLU: relu(x) - alpha * relu(-x), alpha shaped as the input without the batch axis."""

    def __init__(self, alpha_shape):
        super().__init__()
        self.alpha = torch.nn.Parameter(torch.zeros(alpha_shape))

    def forward(self, x):
        return F.relu(x) - self.alpha * F.relu(-x)


class MultiHeadAttention(torch.nn.Module):
    """keras.layers.MultiHeadAttention on [B, T, D] inputs, exactly: Keras' projections as Linears
    (heads flattened: weight [h*k, D]), Keras' mask rules, and what a fully masked query row gets
    (uniform attention in Keras' default call; none with dropout or returned scores)."""

    def __init__(self, query_dim, num_heads, key_dim, value_dim=None, dropout=0.0, use_bias=True, output_dim=None,
                 value_input_dim=None, key_input_dim=None):
        super().__init__()
        value_dim = key_dim if value_dim is None else value_dim  # Keras' defaults, as it resolves them
        output_dim = query_dim if output_dim is None else output_dim
        value_input_dim = query_dim if value_input_dim is None else value_input_dim
        key_input_dim = value_input_dim if key_input_dim is None else key_input_dim  # the key is the value
        self.num_heads, self.key_dim, self.value_dim, self.dropout = num_heads, key_dim, value_dim, dropout
        self.query = torch.nn.Linear(query_dim, num_heads * key_dim, bias=use_bias)
        self.key = torch.nn.Linear(key_input_dim, num_heads * key_dim, bias=use_bias)
        self.value = torch.nn.Linear(value_input_dim, num_heads * value_dim, bias=use_bias)
        self.output = torch.nn.Linear(num_heads * value_dim, output_dim, bias=use_bias)

    def forward(self, query, value, key=None, query_mask=None, value_mask=None, key_mask=None,
                attention_mask=None, use_causal_mask=False, return_attention_scores=False, attention_axes=None):
        if query.dim() > 3:
            # attention_axes: the call over the attention axes flattened, the other axes batch axes.
            masked = any(m is not None for m in (query_mask, value_mask, key_mask, attention_mask))
            if masked or use_causal_mask or return_attention_scores:
                raise NotImplementedError("masks and returned scores of an N-D call are not written for torch yet")
            if attention_axes is None:  # Keras' default: every axis between the batch and the features
                attention_axes = range(1, query.dim() - 1)
            batch = [a for a in range(query.dim() - 1) if a not in attention_axes]
            order = batch + list(attention_axes) + [query.dim() - 1]

            def flatten(x):
                x = x.permute(order)
                n = math.prod(x.shape[: len(batch)])
                return x.reshape(n, -1, x.shape[-1])

            key = value if key is None else key
            out = self.forward(flatten(query), flatten(value), flatten(key))
            permuted = [query.shape[a] for a in order[:-1]] + [out.shape[-1]]
            inverse = [order.index(a) for a in range(query.dim())]
            return out.reshape(permuted).permute(inverse)
        if key is None:
            key, key_mask = value, value_mask
        b, t, s, h = query.shape[0], query.shape[1], value.shape[1], self.num_heads
        q = self.query(query).reshape(b, t, h, self.key_dim).transpose(1, 2)  # [B, h, T, k]
        k = self.key(key).reshape(b, s, h, self.key_dim).transpose(1, 2)  # [B, h, S, k]
        v = self.value(value).reshape(b, s, h, self.value_dim).transpose(1, 2)  # [B, h, S, v]
        scale = 1.0 / math.sqrt(self.key_dim)  # Keras scales q by it before the product
        mask = None  # [B, T, S] or [T, S], True = attend
        for part in (
            None if query_mask is None else query_mask.bool()[:, :, None],
            None if value_mask is None else value_mask.bool()[:, None, :],
            None if key_mask is None else key_mask.bool()[:, None, :],
            None if attention_mask is None else attention_mask.bool(),
        ):
            if part is not None:
                mask = part if mask is None else mask & part
        # A causal mask alone leaves every query row a key (its own step): no row is fully masked.
        fully_masked_rows = mask is not None
        if use_causal_mask:
            causal = torch.ones(t, s, dtype=torch.bool, device=query.device).tril()  # [T, S]
            mask = causal if mask is None else mask & causal
        dropout = self.dropout if self.training else 0.0
        if not return_attention_scores and dropout == 0:
            # The fused kernel: softmax(q k^T scale + bias) v, the hidden pairs' bias -1e9, as
            # Keras' masked softmax adds it; a causal mask alone is the kernel's own (is_causal).
            if mask is None or (use_causal_mask and not fully_masked_rows and t == s):
                attended = F.scaled_dot_product_attention(q, k, v, is_causal=mask is not None, scale=scale)
            else:
                bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, -1e9)
                attended = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.unsqueeze(-3), scale=scale)
            if fully_masked_rows and self.dropout > 0:
                attended = attended * mask.any(-1)[:, None, :, None]  # Keras: a fully masked row attends to nothing
            return self.output(attended.transpose(1, 2).reshape(b, t, h * self.value_dim))
        scores = (q * scale) @ k.transpose(-1, -2)  # [B, h, T, S]
        if mask is not None:
            scores.masked_fill_(~mask.unsqueeze(-3), -1e9)
        probs = torch.softmax(scores, dim=-1)  # [B, h, T, S]
        if fully_masked_rows and (return_attention_scores or self.dropout > 0):
            probs = probs * mask.any(-1, keepdim=True).unsqueeze(-3)  # Keras: a fully masked row attends to nothing
        attended = keras_dropout(probs, dropout) @ v  # [B, h, T, v]
        out = self.output(attended.transpose(1, 2).reshape(b, t, h * self.value_dim))
        return (out, probs) if return_attention_scores else out


def dot_product_attention(query, key, value, bias=None, mask=None, scale=None, is_causal=False):
    """keras.ops.dot_product_attention on [B, T, N, H] (fewer key/value heads: each repeated in place),
    as Keras' TensorFlow backend computes it: a hidden logit becomes -0.7 * 3.38953e38, finite, so a
    fully hidden query row attends to every key alike (torch's boolean mask would give it nothing)."""
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # [B, N, T, H], [B, K, S, H]
    gqa = k.shape[1] != q.shape[1]
    if mask is None and bias is None:
        # A causal mask alone is the kernel's own (top left aligned, as Keras' band_part).
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=gqa)
        return attended.transpose(1, 2)
    if is_causal:
        causal = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()  # [T, S]
        mask = causal if mask is None else mask.bool() & causal
    if mask is not None:
        # Added to logits far smaller than its spacing, the hidden value is what Keras writes.
        hidden = torch.zeros(mask.shape, dtype=q.dtype, device=q.device)
        hidden = hidden.masked_fill(~mask.bool(), -2.3726709583555947e38)
        bias = hidden if bias is None else bias + hidden
    attended = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale, enable_gqa=gqa)
    return attended.transpose(1, 2)


def apply_attention_scores(scores, value, query_mask, value_mask, use_causal_mask, rate, training):
    """Keras' Attention._apply_scores and call: hidden keys lowered by 1e9, softmax, dropout,
    the weighted values, masked queries' rows zeroed."""
    visible = None if value_mask is None else value_mask.bool().unsqueeze(-2)
    if use_causal_mask:
        tq, tv = scores.shape[-2], scores.shape[-1]
        causal = torch.ones(tq, tv, dtype=torch.bool, device=scores.device).tril().unsqueeze(0)
        visible = causal if visible is None else visible & causal
    if visible is not None:
        scores = torch.where(visible, scores, scores - 1e9)
    weights = torch.softmax(scores, dim=-1)
    weights = keras_dropout(weights, rate if training else 0.0)
    output = torch.matmul(weights, value)
    if query_mask is not None:
        output = torch.where(query_mask.bool().unsqueeze(-1), output, 0.0)
    return output, weights


class Attention(torch.nn.Module):
    """keras.layers.Attention: score_mode "dot" (times `scale`) or "concat" scores; the key is
    the value where the call gives none."""

    def __init__(self, use_scale=False, score_mode="dot", dropout=0.0):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(())) if use_scale else None
        self.concat_score_weight = torch.nn.Parameter(torch.ones(())) if score_mode == "concat" else None
        self.rate = dropout

    def forward(self, query, value, key=None, query_mask=None, value_mask=None, use_causal_mask=False,
                return_attention_scores=False):
        key = value if key is None else key
        if self.concat_score_weight is None:
            scores = torch.matmul(query, key.transpose(-2, -1))
            if self.scale is not None:
                scores = scores * self.scale
        else:
            pairs = query.unsqueeze(-2) + key.unsqueeze(-3)
            if self.scale is not None:
                pairs = self.scale * pairs
            scores = self.concat_score_weight * torch.sum(torch.tanh(pairs), dim=-1)
        output, weights = apply_attention_scores(
            scores, value, query_mask, value_mask, use_causal_mask, self.rate, self.training
        )
        return (output, weights) if return_attention_scores else output


class AdditiveAttention(torch.nn.Module):
    """keras.layers.AdditiveAttention: scores sum(scale * tanh(q + k)) over the features (the
    scale's length, with use_scale); the key is the value where the call gives none."""

    def __init__(self, features=None, use_scale=True, dropout=0.0):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(features)) if use_scale else None
        self.rate = dropout

    def forward(self, query, value, key=None, query_mask=None, value_mask=None, use_causal_mask=False,
                return_attention_scores=False):
        key = value if key is None else key
        pairs = torch.tanh(query.unsqueeze(-2) + key.unsqueeze(-3))
        if self.scale is not None:
            pairs = self.scale * pairs
        scores = torch.sum(pairs, dim=-1)
        output, weights = apply_attention_scores(
            scores, value, query_mask, value_mask, use_causal_mask, self.rate, self.training
        )
        return (output, weights) if return_attention_scores else output


class Recurrent(torch.nn.Module):
    """keras.layers.LSTM, GRU or SimpleRNN step by step, as Keras' cells and its loop compute
    them, with its masks: a masked step keeps the states and repeats the previous output (zeros
    with zero_output_for_mask). The variables keep Keras' layout: kernel [in, gates * units],
    recurrent_kernel [units, gates * units], bias [gates * units] ([2, 3 * units] for a GRU with
    reset_after: the input and the recurrent bias). In training, dropout and recurrent_dropout
    draw one mask per call for all steps (one per gate block where a gated cell has a
    recurrent_dropout), as Keras' DropoutRNNCell. Returns what the layer returns: every step's
    output in the order run (return_sequences) or the last, then the states."""

    GATES = {"lstm": 4, "gru": 3, "simple_rnn": 1}

    def __init__(self, cell, input_size, units, activation="tanh", recurrent_activation="sigmoid",
                 use_bias=True, reset_after=True, return_sequences=False, return_state=False,
                 go_backwards=False, zero_output_for_mask=False, dropout=0.0, recurrent_dropout=0.0):
        super().__init__()
        width = self.GATES[cell] * units
        self.cell, self.units, self.reset_after = cell, units, reset_after
        self.activation, self.recurrent_activation = ACTIVATIONS[activation], ACTIVATIONS[recurrent_activation]
        self.return_sequences, self.return_state = return_sequences, return_state
        self.go_backwards, self.zero_output_for_mask = go_backwards, zero_output_for_mask
        self.dropout, self.recurrent_dropout = dropout, recurrent_dropout
        self.kernel = torch.nn.Parameter(torch.zeros(input_size, width))
        self.recurrent_kernel = torch.nn.Parameter(torch.zeros(units, width))
        bias_shape = (2, width) if cell == "gru" and reset_after else (width,)
        self.bias = torch.nn.Parameter(torch.zeros(bias_shape)) if use_bias else None

    def masks(self, rate, shape, like):
        """One call's dropout masks (0 or 1 / (1 - rate)), none outside training."""
        if not self.training or not 0.0 < rate < 1.0:
            return []
        count = self.GATES[self.cell] if self.recurrent_dropout > 0.0 and self.cell != "simple_rnn" else 1
        return [F.dropout(like.new_ones(shape), rate, True) for _ in range(count)]

    def product(self, x, kernel, masks):
        """x @ kernel with x's dropout masks: none, one, or one per gate block (on its columns)."""
        if len(masks) <= 1:
            return (x * masks[0] if masks else x) @ kernel
        u = self.units
        return torch.cat([(x * m) @ kernel[:, k * u : (k + 1) * u] for k, m in enumerate(masks)], dim=-1)

    def step(self, x, states, masks):
        """One step: x [B, gates * units], this step's inputs times the kernel plus the input bias."""
        h, u, act, sigma = states[0], self.units, self.activation, self.recurrent_activation
        if self.cell == "lstm":
            i, f, c, o = (x + self.product(h, self.recurrent_kernel, masks)).split(u, dim=-1)
            c = sigma(f) * states[1] + sigma(i) * act(c)
            return [sigma(o) * act(c), c]
        if self.cell == "simple_rnn":
            return [act(x + self.product(h, self.recurrent_kernel, masks))]
        x_z, x_r, x_h = x.split(u, dim=-1)
        if self.reset_after:
            inner = self.product(h, self.recurrent_kernel, masks) + (self.bias[1] if self.bias is not None else 0.0)
            h_z, h_r, h_h = inner.split(u, dim=-1)
            z, r = sigma(x_z + h_z), sigma(x_r + h_r)
            candidate = act(x_h + r * h_h)
        else:
            h_z, h_r = self.product(h, self.recurrent_kernel[:, : 2 * u], masks[:2]).split(u, dim=-1)
            z, r = sigma(x_z + h_z), sigma(x_r + h_r)
            candidate = act(x_h + (r * (h * masks[2] if masks else h)) @ self.recurrent_kernel[:, 2 * u :])
        return [z * h + (1 - z) * candidate]

    def forward(self, x, mask=None, initial_state=None):
        batch, steps = x.shape[0], x.shape[1]
        input_masks = [m[:, None] for m in self.masks(self.dropout, (batch, x.shape[-1]), x)]
        recurrent_masks = self.masks(self.recurrent_dropout, (batch, self.units), x)
        projected = self.product(x, self.kernel, input_masks)  # every step's inputs at once: [B, T, gates * units]
        if self.bias is not None:
            projected = projected + (self.bias[0] if self.bias.dim() == 2 else self.bias)
        count = 2 if self.cell == "lstm" else 1
        states = list(initial_state) if initial_state is not None else [x.new_zeros(batch, self.units)] * count
        output, outputs = x.new_zeros(batch, self.units), []
        for t in (range(steps - 1, -1, -1) if self.go_backwards else range(steps)):
            new_states = self.step(projected[:, t], states, recurrent_masks)
            if mask is None:
                states, output = new_states, new_states[0]
            else:
                keep = mask[:, t, None].bool()  # [B, 1]
                held = torch.zeros_like(output) if self.zero_output_for_mask else output
                output = torch.where(keep, new_states[0], held)
                states = [torch.where(keep, new, old) for new, old in zip(new_states, states)]
            outputs.append(output)
        result = torch.stack(outputs, dim=1) if self.return_sequences else output
        return (result, *states) if self.return_state else result


class Bidirectional(torch.nn.Module):
    """keras.layers.Bidirectional: one recurrent layer forward, one backward (go_backwards), both
    with the mask; the backward outputs put back in time order when they are sequences, merged
    by merge_mode ("concat", "sum", "mul", "ave", or None for both); then the forward layer's
    states and the backward one's."""

    def __init__(self, forward_layer, backward_layer, merge_mode="concat"):
        super().__init__()
        self.forward_layer, self.backward_layer, self.merge_mode = forward_layer, backward_layer, merge_mode

    def forward(self, x, mask=None, initial_state=None):
        half = None if initial_state is None else len(initial_state) // 2
        y = self.forward_layer(x, mask, None if initial_state is None else initial_state[:half])
        y_rev = self.backward_layer(x, mask, None if initial_state is None else initial_state[half:])
        states = []
        if self.forward_layer.return_state:
            y, y_rev, states = y[0], y_rev[0], [*y[1:], *y_rev[1:]]
        if self.forward_layer.return_sequences:
            y_rev = y_rev.flip(1)
        merged = {
            "concat": lambda: (torch.cat([y, y_rev], dim=-1),),
            "sum": lambda: (y + y_rev,),
            "mul": lambda: (y * y_rev,),
            "ave": lambda: ((y + y_rev) / 2,),
            None: lambda: (y, y_rev),
        }[self.merge_mode]()
        outputs = (*merged, *states)
        return outputs[0] if len(outputs) == 1 else outputs


def keras_dropout(x, rate):
    """Dropout in training: each element zeroed with probability `rate`, the others scaled by
    1 / (1 - rate), as F.dropout and Keras; the draw from 32 random bits per element, two from
    each of torch's 64-bit draws (F.dropout's bernoulli_ on the CPU takes twice as long:
    46 against 25 ms on [64, 6, 136, 136], 2 threads)."""
    if rate == 0:
        return x
    n = x.numel()
    bits = torch.empty((n + 1) // 2, dtype=torch.int64, device=x.device).random_(-(2**63), None)
    bits = bits.view(torch.int32)[:n].view(x.shape)  # uniform over every int32
    keep = bits >= round(rate * 2**32) - 2**31  # probability 1 - rate, to 2^-32
    return x * (keep * (1.0 / (1.0 - rate)))  # the scaled mask, which the gradient reuses


def dropout(x, rate, training=False, noise_shape=None):
    """keras.layers.Dropout: keras_dropout in training (drawn in noise_shape, None where it is
    x's size, and broadcast), the identity otherwise."""
    if not training or rate == 0:
        return x
    if noise_shape is None:
        return keras_dropout(x, rate)
    shape = [size if wanted is None else wanted for size, wanted in zip(x.shape, noise_shape)]
    return x * keras_dropout(torch.ones(shape, device=x.device), rate)


def spatial_dropout1d(x, rate, training=False):
    """keras.layers.SpatialDropout1D: in training, whole channels of each sequence zeroed with
    probability `rate` and the rest scaled by 1 / (1 - rate); the identity otherwise."""
    if not training or rate == 0:
        return x
    keep = torch.bernoulli(torch.full((x.shape[0], 1, x.shape[-1]), 1 - rate, device=x.device))
    return x * keep / (1 - rate)


def gaussian_noise(x, stddev, training=False):
    """keras.layers.GaussianNoise: x + N(0, stddev^2) noise in training, the identity otherwise."""
    return x + torch.randn_like(x) * stddev if training and stddev > 0 else x


def gaussian_dropout(x, rate, training=False):
    """keras.layers.GaussianDropout: x * N(1, rate / (1 - rate)) noise in training, the identity otherwise."""
    return x * (1 + torch.randn_like(x) * math.sqrt(rate / (1 - rate))) if training and 0 < rate < 1 else x
