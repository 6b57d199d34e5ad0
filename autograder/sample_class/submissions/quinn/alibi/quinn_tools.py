from quinn_rows import last_axis


def softmax(x):  # my own
    return last_axis(x)
