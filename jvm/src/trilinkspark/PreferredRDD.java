package trilinkspark;

import java.util.Collections;

import org.apache.spark.Partition;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.rdd.RDD;
import org.apache.spark.util.CollectionAccumulator;

import scala.collection.Iterator;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;
import scala.reflect.ClassTag;

/**
 * Its parent, partition for partition, with a preferred location per partition.
 *
 * <p>Partition {@code i} reads partition {@code i} of the parent (a one-to-one dependency, so
 * no stage is added) and asks the scheduler for {@code locations[i]}: a task location string
 * such as {@code executor_<host>_<executorId>}, which Spark's scheduler treats as
 * PROCESS_LOCAL on that executor. An empty or missing entry asks for nothing.
 *
 * <p>Each task that computes a partition records where it ran: the executor id and host, in
 * the task's local property {@code property} (so the Python worker that the task starts next
 * can read it) and as {@code "<partition>\t<executorId>\t<host>"} in the accumulator
 * {@code ran}, which the driver reads once the job is done.
 */
public final class PreferredRDD<T> extends RDD<T> {
  private static final long serialVersionUID = 1L;

  private final String[] locations;
  private final CollectionAccumulator<String> ran;
  private final String property;
  private final ClassTag<T> tag;

  public PreferredRDD(RDD<T> parent, String[] locations, CollectionAccumulator<String> ran,
                      String property) {
    super(parent, parent.elementClassTag());
    this.locations = locations.clone();
    this.ran = ran;
    this.property = property;
    this.tag = parent.elementClassTag();
  }

  @Override
  public Partition[] getPartitions() {
    return firstParent(tag).partitions();
  }

  @Override
  public Iterator<T> compute(Partition split, TaskContext context) {
    SparkEnv env = SparkEnv.get();
    String executor = env.executorId();
    String host = env.blockManager().blockManagerId().host();
    context.getLocalProperties().setProperty(property, executor + "\t" + host);
    ran.add(split.index() + "\t" + executor + "\t" + host);
    return firstParent(tag).iterator(split, context);
  }

  @Override
  public Seq<String> getPreferredLocations(Partition split) {
    int i = split.index();
    String where = i < locations.length ? locations[i] : null;
    if (where == null || where.isEmpty()) {
      return CollectionConverters.asScala(Collections.<String>emptyList()).toList();
    }
    return CollectionConverters.asScala(Collections.singletonList(where)).toList();
  }
}
