"""keras.io "End-to-end Masked Language Modeling with BERT" (Ankur Singh; converted to Keras 3 by
Sitam Meur, made backend-agnostic by Humbulani Ndou): the example's masked-language model as it
writes it (`create_masked_language_bert_model`: word embedding plus position embedding, its
functional `bert_module` encoder of `MultiHeadAttention`, `LayerNormalization` and a `Sequential`
feed-forward, and the softmax `mlm_cls` head) in its `MaskedLanguageModel`, a `keras.Model`
subclass for its loss and metric only, at small sizes. The `TextVectorization` stays outside: the
model takes token ids.

The position embedding is keras.io's `keras_hub.layers.PositionEmbedding`: a learned weight that
its `call` reads, sliced to the sequence and broadcast to the input. keras_hub is not a dependency
here, so `PositionEmbedding` below is its code (keras_hub 0.2x) as a class of the example; a model
built on keras_hub's own class flattens the same way. The flattener keeps the weight a weight
(a `Weight` node of the flattened graph).

https://keras.io/examples/nlp/masked_language_modeling/
"""

import keras
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


@keras.saving.register_keras_serializable(package="bert_mlm")
class PositionEmbedding(keras.layers.Layer):
    """keras_hub.layers.PositionEmbedding's code (keras_hub is not installed here)."""

    def __init__(self, sequence_length, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        if sequence_length is None:
            raise ValueError("`sequence_length` must be an Integer, received `None`.")
        self.sequence_length = int(sequence_length)
        self.initializer = keras.initializers.get(initializer)

    def get_config(self):
        config = super().get_config()
        config.update({"sequence_length": self.sequence_length,
                       "initializer": keras.initializers.serialize(self.initializer)})
        return config

    def build(self, inputs_shape):
        feature_size = inputs_shape[-1]
        self.position_embeddings = self.add_weight(
            name="embeddings", shape=[self.sequence_length, feature_size], initializer=self.initializer,
            trainable=True,
        )
        self.built = True

    def call(self, inputs, start_index=0, positions=None):
        shape = keras.ops.shape(inputs)
        feature_length = shape[-1]
        sequence_length = shape[-2]
        # trim to match the length of the input sequence, which might be less
        # than the sequence_length of the layer.
        position_embeddings = keras.ops.convert_to_tensor(self.position_embeddings)
        if positions is None:
            position_embeddings = keras.ops.slice(
                position_embeddings, (start_index, 0), (sequence_length, feature_length)
            )
        else:
            position_embeddings = keras.ops.take(position_embeddings, positions, axis=0)
        return keras.ops.broadcast_to(position_embeddings, shape)

    def compute_output_shape(self, input_shape):
        return input_shape


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
    position_embeddings = PositionEmbedding(  # keras.io: keras_hub.layers.PositionEmbedding
        sequence_length=config.MAX_LEN
    )(word_embeddings)
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
