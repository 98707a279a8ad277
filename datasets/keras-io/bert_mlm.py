"""keras.io "End-to-end Masked Language Modeling with BERT" (Ankur Singh; converted to Keras 3 by
Sitam Meur, made backend-agnostic by Humbulani Ndou): the example's masked-language model as it
writes it (`create_masked_language_bert_model`: word embedding plus position embedding, its
functional `bert_module` encoder of `MultiHeadAttention`, `LayerNormalization` and a `Sequential`
feed-forward, and the softmax `mlm_cls` head) in its `MaskedLanguageModel`, a `keras.Model`
subclass for its loss and metric only, at small sizes. The `TextVectorization` stays outside: the
model takes token ids.

The position embedding is the example's `Embedding` initialised from the sinusoidal matrix
(`get_pos_encoding_matrix`) and called on the constant range of positions, as the example wrote it
before it took `keras_hub.layers.PositionEmbedding` (a learned one, as in `compact_convolutional_
transformer`): Keras computes it when the model is built, so the model holds the matrix as a
constant operand of its `add`, not as a layer.

https://keras.io/examples/nlp/masked_language_modeling/
"""

import keras
import numpy as np
from keras import layers


class Config:
    MAX_LEN = 12
    LR = 0.001
    VOCAB_SIZE = 50
    EMBED_DIM = 8
    NUM_HEAD = 2  # used in bert model
    FF_DIM = 8  # used in bert model
    NUM_LAYERS = 1


config = Config()  # the example's 256, 30000, 128, 8, 128 and 1 made small


def bert_module(query, key, value, i):
    # Multi headed self-attention
    attention_output = layers.MultiHeadAttention(
        num_heads=config.NUM_HEAD,
        key_dim=config.EMBED_DIM // config.NUM_HEAD,
        name="encoder_{}_multiheadattention".format(i),
    )(query, key, value)
    attention_output = layers.Dropout(0.1, name="encoder_{}_att_dropout".format(i))(
        attention_output
    )
    attention_output = layers.LayerNormalization(
        epsilon=1e-6, name="encoder_{}_att_layernormalization".format(i)
    )(query + attention_output)

    # Feed-forward layer
    ffn = keras.Sequential(
        [
            layers.Dense(config.FF_DIM, activation="relu"),
            layers.Dense(config.EMBED_DIM),
        ],
        name="encoder_{}_ffn".format(i),
    )
    ffn_output = ffn(attention_output)
    ffn_output = layers.Dropout(0.1, name="encoder_{}_ffn_dropout".format(i))(
        ffn_output
    )
    sequence_output = layers.LayerNormalization(
        epsilon=1e-6, name="encoder_{}_ffn_layernormalization".format(i)
    )(attention_output + ffn_output)
    return sequence_output


def get_pos_encoding_matrix(max_len, d_emb):
    pos_enc = np.array(
        [
            [pos / np.power(10000, 2 * (j // 2) / d_emb) for j in range(d_emb)]
            if pos != 0
            else np.zeros(d_emb)
            for pos in range(max_len)
        ]
    )
    pos_enc[1:, 0::2] = np.sin(pos_enc[1:, 0::2])  # dim 2i
    pos_enc[1:, 1::2] = np.cos(pos_enc[1:, 1::2])  # dim 2i+1
    return pos_enc


loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)
loss_tracker = keras.metrics.Mean(name="loss")


@keras.saving.register_keras_serializable(package="bert_mlm")
class MaskedLanguageModel(keras.Model):

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):

        loss = loss_fn(y, y_pred, sample_weight)
        loss_tracker.update_state(loss, sample_weight=sample_weight)
        return keras.ops.sum(loss)

    def compute_metrics(self, x, y, y_pred, sample_weight):

        # Return a dict mapping metric names to current value
        return {"loss": loss_tracker.result()}

    @property
    def metrics(self):
        # We list our `Metric` objects here so that `reset_states()` can be
        # called automatically at the start of each epoch
        # or at the start of `evaluate()`.
        # If you don't implement this property, you have to call
        # `reset_states()` yourself at the time of your choosing.
        return [loss_tracker]


def create_masked_language_bert_model():
    inputs = layers.Input((config.MAX_LEN,), dtype="int64")

    word_embeddings = layers.Embedding(
        config.VOCAB_SIZE, config.EMBED_DIM, name="word_embedding"
    )(inputs)
    position_embeddings = layers.Embedding(
        input_dim=config.MAX_LEN,
        output_dim=config.EMBED_DIM,
        weights=[get_pos_encoding_matrix(config.MAX_LEN, config.EMBED_DIM)],
        name="position_embedding",
    )(keras.ops.arange(start=0, stop=config.MAX_LEN, step=1))
    embeddings = word_embeddings + position_embeddings

    encoder_output = embeddings
    for i in range(config.NUM_LAYERS):
        encoder_output = bert_module(encoder_output, encoder_output, encoder_output, i)

    mlm_output = layers.Dense(config.VOCAB_SIZE, name="mlm_cls", activation="softmax")(
        encoder_output
    )
    mlm_model = MaskedLanguageModel(inputs, mlm_output, name="masked_bert_model")

    optimizer = keras.optimizers.Adam(learning_rate=config.LR)
    mlm_model.compile(optimizer=optimizer)
    return mlm_model


def build_model():
    """The example's `create_masked_language_bert_model()` at the sizes of `config`."""
    return create_masked_language_bert_model()
