"""Not a keras.io example: the flattener's own case beside them. A custom embedding whose
`compute_mask` masks the padding id 0 (as keras.io's `PositionalEmbedding` does), read
implicitly by built-in layers after it: a masked `GlobalAveragePooling1D` and an `LSTM` that
skips the padded steps. Flattened, the built-ins record the traced mask as their `mask=`.
"""

import keras
from keras import layers, ops


@keras.saving.register_keras_serializable(package="masked_pooling")
class MaskedEmbedding(layers.Layer):
    def __init__(self, vocab_size, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.embed_dim = embed_dim
        self.token_embeddings = layers.Embedding(vocab_size, embed_dim)

    def call(self, inputs):
        return self.token_embeddings(inputs) * ops.sqrt(ops.cast(self.embed_dim, "float32"))

    def compute_mask(self, inputs, mask=None):
        return ops.not_equal(inputs, 0)

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "embed_dim": self.embed_dim}


def build_model():
    tokens = keras.Input((8,), dtype="int32", name="tokens")
    x = MaskedEmbedding(30, 4, name="embedding")(tokens)
    pooled = layers.GlobalAveragePooling1D(name="pool")(x)
    sequences = layers.LSTM(3, return_sequences=True, name="lstm")(x)
    last = layers.GRU(2, name="gru")(sequences)
    return keras.Model(tokens, [pooled, last], name="masked_pooling")
