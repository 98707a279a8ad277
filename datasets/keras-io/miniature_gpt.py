"""keras.io "Text generation with a miniature GPT" (Apoorv Nandan): its `causal_attention_mask`
(a lower-triangular mask tiled to the batch size read from the input's shape in call, given to a
built-in `MultiHeadAttention` as `attention_mask=`), `TransformerBlock` and
`TokenAndPositionEmbedding` as the example writes them (`get_config` added; the mask's tile
repeats given as a list, not a tensor, without which keras 3.15.1 on TensorFlow cannot build the
model), and its model with both of its outputs (the logits and the transformer block's output),
at small sizes. The causal mask is built from the batch size in `call`: flattening needs
`--batch-size`.

https://keras.io/examples/generative/text_generation_with_miniature_gpt/
"""

import keras
from keras import layers, ops


def causal_attention_mask(batch_size, n_dest, n_src, dtype):
    """
    Mask the upper half of the dot product matrix in self attention.
    This prevents flow of information from future tokens to current token.
    1's in the lower triangle, counting from the lower right corner.
    """
    i = ops.arange(n_dest)[:, None]
    j = ops.arange(n_src)
    m = i >= j - n_src + n_dest
    mask = ops.cast(m, dtype)
    mask = ops.reshape(mask, [1, n_dest, n_src])
    # keras.io: `mult = ops.concatenate([ops.expand_dims(batch_size, -1),
    # ops.convert_to_tensor([1, 1])], 0)`, a 1-D tensor that keras 3.15.1's TensorFlow `ops.tile`
    # iterates over, which a symbolic tensor refuses while Keras builds the model in a graph
    # (OperatorNotAllowedInGraphError): the same repeats as a list.
    mult = [batch_size, 1, 1]
    return ops.tile(mask, mult)


@keras.saving.register_keras_serializable(package="miniature_gpt")
class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.embed_dim, self.num_heads, self.ff_dim, self.rate = embed_dim, num_heads, ff_dim, rate
        self.att = layers.MultiHeadAttention(num_heads, embed_dim)
        self.ffn = keras.Sequential(
            [
                layers.Dense(ff_dim, activation="relu"),
                layers.Dense(embed_dim),
            ]
        )
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs):
        input_shape = ops.shape(inputs)
        batch_size = input_shape[0]
        seq_len = input_shape[1]
        causal_mask = causal_attention_mask(batch_size, seq_len, seq_len, "bool")
        attention_output = self.att(inputs, inputs, attention_mask=causal_mask)
        attention_output = self.dropout1(attention_output)
        out1 = self.layernorm1(inputs + attention_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output)
        return self.layernorm2(out1 + ffn_output)

    def get_config(self):
        return {**super().get_config(), "embed_dim": self.embed_dim, "num_heads": self.num_heads,
                "ff_dim": self.ff_dim, "rate": self.rate}


@keras.saving.register_keras_serializable(package="miniature_gpt")
class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.maxlen, self.vocab_size, self.embed_dim = maxlen, vocab_size, embed_dim
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = ops.shape(x)[-1]
        positions = ops.arange(0, maxlen, 1)
        positions = self.pos_emb(positions)
        x = self.token_emb(x)
        return x + positions

    def get_config(self):
        return {**super().get_config(), "maxlen": self.maxlen, "vocab_size": self.vocab_size,
                "embed_dim": self.embed_dim}


def build_model(vocab_size=50, maxlen=10, embed_dim=8, num_heads=2, feed_forward_dim=8):
    """`create_model()` (the example's 20000, 80, 256, 2, 256 made small; not compiled)."""
    inputs = layers.Input(shape=(maxlen,), dtype="int32")
    embedding_layer = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim)
    x = embedding_layer(inputs)
    transformer_block = TransformerBlock(embed_dim, num_heads, feed_forward_dim)
    x = transformer_block(x)
    outputs = layers.Dense(vocab_size)(x)
    return keras.Model(inputs=inputs, outputs=[outputs, x])
